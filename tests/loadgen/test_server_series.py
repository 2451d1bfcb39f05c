"""The server's /metrics as a time series over each level (loadgen/telemetry/series.py): scraped
during a replay, normalised, summarised over the window; a failing scrape is recorded, never fatal."""

from __future__ import annotations

import asyncio

import pytest

from loadgen.telemetry.series import ServerSeries
from loadgen.transport.base import TransportError


def _exposition(running: float, hits: float, queries: float, kv: float) -> str:
    return (f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name=\"m\"}} {running}\n"
            f"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{model_name=\"m\"}} {kv}\n"
            f"# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{{model_name=\"m\"}} {hits}\n"
            f"# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{{model_name=\"m\"}} {queries}\n"
            "# TYPE my_engine_widgets gauge\nmy_engine_widgets{kind=\"a\"} 7\n")


def test_the_window_summary_from_known_scrapes():
    texts = iter([_exposition(0, 100, 200, 0.1), _exposition(4, 150, 300, 0.5), "garbage line {",
                  _exposition(2, 400, 700, 0.3), _exposition(0, 500, 800, 0.2)])

    async def fetch() -> str:
        return next(texts)

    series = ServerSeries(fetch, 1.0)

    async def scrape_all() -> None:
        for _ in range(5):
            await series.scrape()

    asyncio.run(scrape_all())
    assert series.failed == 1 and "ParseError" in series.errors[0]
    t = series.times_ns
    # the window opens just after the first scrape and closes after the third good one
    doc = series.summary(t[0] + 1, (t[2] - t[0]) / 1e9)
    assert doc["adapter"] == "vllm" and doc["scrapes"] == 4 and doc["failed_scrapes"] == 1
    window = doc["window"]
    assert window["running"] == {"mean": 3.0, "max": 4.0}  # the two scrapes inside the window
    assert window["kv_cache_usage"] == {"mean": 0.4, "max": 0.5}
    # counters from the last scrape before the window to the last one (after the drain)
    assert window["prefix_cache_hits"] == 400 and window["prefix_cache_queries"] == 600
    assert window["prefix_cache_hit_rate"] == pytest.approx(400 / 600, abs=1e-6)
    assert doc["series"]["running"] == [0, 4, 2, 0] and len(doc["series"]["t_s"]) == 4
    assert doc["raw_first"] == {'my_engine_widgets{kind="a"}': 7.0}  # unknown metrics kept raw


def test_a_server_without_metrics_is_recorded_and_the_run_goes_on(start_server, sessions, replay):
    server = start_server(first_ms=2, itl_ms=2)  # no /metrics: 404
    folder = sessions({"n_requests": 8, "think": 0.0})
    code, doc, _ = replay(server.url, "--traces", str(folder), "--duration", "1.5", "--server-metrics-interval",
                          "0.25")
    assert code == 0
    metrics = doc["levels"][0]["server_metrics"]
    assert metrics["scrapes"] == 0 and metrics["failed_scrapes"] >= 4
    assert "HTTP 404" in metrics["errors"][0]
    assert doc["levels"][0]["counts"]["requests_ok"] > 0


def test_scraping_off(start_server, sessions, replay):
    server = start_server(first_ms=2, itl_ms=2)
    code, doc, _ = replay(server.url, "--traces", str(sessions({"n_requests": 4, "think": 0.0})), "--duration", "0.5",
                          "--server-metrics-interval", "0")
    assert code == 0 and "server_metrics" not in doc["levels"][0]


def test_a_transport_without_metrics_says_so():
    from loadgen.transport.base import Transport

    class Bare(Transport):
        async def open(self, max_connections: int) -> None: ...
        async def server_info(self): ...
        async def send(self, request): ...
        async def close(self) -> None: ...

    with pytest.raises(TransportError, match="no /metrics"):
        asyncio.run(Bare().metrics_text())
