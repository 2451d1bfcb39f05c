"""Reading a whole /metrics scrape: loadgen/telemetry's parser against prometheus_client's, and what
one scrape a second costs the client's event loop (issue 39, item 1). CPU, not run by CI.

Scrapes: the recorded-style vLLM (text 0.0.4) and SGLang (OpenMetrics) expositions of
tests/loadgen/data, our server's (server/metrics.py after 20,000 requests), and a vLLM server with
four data-parallel engines (the vLLM one with each engine's series four times: 1,896 series, most of
them histogram buckets). Before timing anything the script checks that both parsers read the
same samples (names, labels, values) from every scrape.

Per scrape, the median of `--calls` timed calls: ours `parse` (every sample as a Sample), ours
`normalise` (the engine adapter: what a scrape a second runs), ours `totals` of the two speculative
counters (what loadgen reads at window edges), and prometheus_client's
`text_string_to_metric_families` (its OpenMetrics parser for the OpenMetrics scrape) with every
sample read. Ours keeps a cache of the series it has read (a server repeats them at every scrape):
"cold" clears it before each call, the cost of a server's first scrape.

Event loop: a server process serves the four-engine scrape over keep-alive HTTP on 127.0.0.1; the
client, on loadgen's loop (uvloop where installed) and HTTP client, fetches it `--scrapes` times
back to back, decodes it and normalises it (or parses it with prometheus_client). Reported per
scrape: the loop thread's CPU (fetch, decode, parse), which over one second is its share of a
core at one scrape a second, and the wall time of the decode and parse, the stretch the loop
runs nothing else (median and max).

Needs prometheus_client, which agentload does not depend on (`pip install prometheus_client`).

    PYTHONPATH=. python benchmarks/prometheus_parse.py            # full run (about a minute)
    PYTHONPATH=. python benchmarks/prometheus_parse.py --smoke    # a few iterations: tests the script
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from loadgen.run.event_loop import run_event_loop
from loadgen.telemetry import prometheus
from loadgen.telemetry.engines import normalise
from loadgen.transport.wire import HttpClient
from server.engine.messages import EngineStats
from server.metrics import ServerMetrics

DATA = Path(__file__).resolve().parent.parent / "tests" / "loadgen" / "data"
SPEC = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total")
ENGINES = 4


def scrapes() -> dict[str, tuple[str, bool]]:
    """name -> (exposition, whether it is OpenMetrics)."""
    vllm = (DATA / "vllm_metrics.prom").read_text()
    return {
        "vLLM fixture": (vllm, False),
        "SGLang fixture (OpenMetrics)": ((DATA / "sglang_metrics.prom").read_text(), True),
        "our server": (our_server(), False),
        f"vLLM, {ENGINES} engines": (replicated(vllm, ENGINES), False),
    }


def our_server() -> str:
    rng = random.Random(0)
    metrics = ServerMetrics("tiny")
    for i in range(20_000):
        metrics.ttft.observe(rng.lognormvariate(-2.5, 1.0))
        metrics.itl.observe(rng.lognormvariate(-4.0, 0.7))
        metrics.e2e.observe(rng.lognormvariate(1.0, 1.0))
        metrics.observe_finished(("stop", "length")[i % 2])
    stats = EngineStats(num_running=12, num_waiting=3, kv_cache_usage=0.4375, prefix_cache_queries=912_345,
                        prefix_cache_hits=700_001, prompt_tokens=1_234_567, generation_tokens=345_678,
                        spec_num_drafts=50_000, spec_num_draft_tokens=150_000, spec_num_accepted_tokens=120_000,
                        spec_accepted_per_position=(45_000, 40_000, 35_000))
    return metrics.render(stats, 7).decode()


def replicated(text: str, engines: int) -> str:
    lines = []
    for line in text.split("\n"):
        copies = [line.replace('engine="0"', f'engine="{e}"') for e in range(engines)]
        lines.extend(copies if 'engine="0"' in line else [line])
    return "\n".join(lines)


def client_samples(text: str, openmetrics: bool) -> list:
    if openmetrics:
        from prometheus_client.openmetrics.parser import text_string_to_metric_families
    else:
        from prometheus_client.parser import text_string_to_metric_families
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def same_samples(text: str, openmetrics: bool) -> bool:
    def key(name: str, labels: tuple, value: float) -> tuple:
        return name, tuple(sorted(labels)), "nan" if math.isnan(value) else value

    ours = sorted(key(s.name, s.labels, s.value) for s in prometheus.parse(text).samples)
    theirs = sorted(key(s.name, tuple(s.labels.items()), s.value) for s in client_samples(text, openmetrics))
    return ours == theirs


def median_us(fn: Callable[[], object], calls: int, before: Callable[[], object] | None = None) -> float:
    times = []
    for _ in range(calls):
        if before is not None:
            before()
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e3


def parse_rows(calls: int) -> list[tuple[str, int, int, dict[str, float]]]:
    rows = []
    for name, (text, om) in scrapes().items():
        if not same_samples(text, om):
            raise SystemExit(f"prometheus_parse: error: the two parsers disagree on {name}")
        prometheus.parse(text)  # the series cache as a scrape a second finds it
        timings = {
            "parse": median_us(lambda t=text: prometheus.parse(t), calls),
            "parse, cold": median_us(lambda t=text: prometheus.parse(t), calls, prometheus._SERIES_CACHE.clear),
            "normalise": median_us(lambda t=text: normalise(t), calls),
            "totals (2 counters)": median_us(lambda t=text: prometheus.totals(t, SPEC), calls),
            "prometheus_client": median_us(lambda t=text, o=om: client_samples(t, o), max(3, calls // 10)),
        }
        rows.append((name, len(text), len(prometheus.parse(text).samples), timings))
    return rows


async def serve(body: bytes) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n\r\n" % len(body)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            writer.write(head + body)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print("PORT", server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


async def scrape_loop(url: str, read: Callable[[str], object], scrapes_n: int) -> tuple[list[int], list[int]]:
    """(loop-thread CPU ns, decode-and-parse wall ns) of each scrape, fetched back to back."""
    client = HttpClient(url, {}, 1)
    cpu, blocked = [], []
    try:
        for _ in range(scrapes_n):
            cpu_start = time.thread_time_ns()
            resp = await client.request("GET", "/metrics", timeout=30)
            start = time.perf_counter_ns()
            read(resp.body.decode("utf-8", "replace"))
            blocked.append(time.perf_counter_ns() - start)
            cpu.append(time.thread_time_ns() - cpu_start)
    finally:
        await client.close()
    return cpu, blocked


def loop_rows(text: str, scrapes_n: int) -> list[tuple[str, float, float, float]]:
    with tempfile.NamedTemporaryFile("w", suffix=".prom") as body:
        body.write(text)
        body.flush()
        server = subprocess.Popen([sys.executable, __file__, "--serve", body.name], stdout=subprocess.PIPE, text=True)
        try:
            url = f"http://127.0.0.1:{server.stdout.readline().split()[1]}"  # type: ignore[union-attr]
            rows = []
            for label, read in (("ours: normalise", normalise),
                                ("prometheus_client", lambda t: client_samples(t, False))):
                cpu, blocked = run_event_loop(scrape_loop(url, read, scrapes_n))
                rows.append((label, statistics.median(cpu) / 1e3, statistics.median(blocked) / 1e3, max(blocked) / 1e3))
        finally:
            server.kill()
            server.wait()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=400, help="timed calls per parser and scrape")
    parser.add_argument("--scrapes", type=int, default=300, help="scrapes over HTTP per parser")
    parser.add_argument("--smoke", action="store_true", help="a few iterations, to test the script")
    parser.add_argument("--serve", metavar="FILE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve(Path(args.serve).read_bytes()))
        return 0
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        print("prometheus_parse: error: needs prometheus_client (pip install prometheus_client)", file=sys.stderr)
        return 2
    calls, scrapes_n = (5, 5) if args.smoke else (args.calls, args.scrapes)
    columns = ("parse", "parse, cold", "normalise", "totals (2 counters)", "prometheus_client")
    print(f"{'scrape':<30} {'bytes':>7} {'series':>6} " + " ".join(f"{c:>20}" for c in columns) + "   (us, median)")
    for name, size, series, timings in parse_rows(calls):
        ratio = timings["prometheus_client"] / timings["parse"]
        print(f"{name:<30} {size:>7} {series:>6} " + " ".join(f"{timings[c]:>20.1f}" for c in columns)
              + f"   client/parse {ratio:.1f}x")
    big = scrapes()[f"vLLM, {ENGINES} engines"][0]
    print(f"\nevent loop, {scrapes_n} scrapes of the {ENGINES}-engine scrape ({len(big)} bytes) over HTTP:")
    print(f"{'reader':<20} {'CPU/scrape us':>14} {'share of a core at 1/s':>23} {'block median us':>16} "
          f"{'block max us':>13}")
    for label, cpu_us, block_us, block_max_us in loop_rows(big, scrapes_n):
        print(f"{label:<20} {cpu_us:>14.0f} {cpu_us / 1e6:>22.3%} {block_us:>16.0f} {block_max_us:>13.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
