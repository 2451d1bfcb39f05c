"""Prometheus text: the hand-written exposition and parsing against prometheus_client (CPU, not run by CI).

Measures, on this machine, what each side costs where it runs:
- server/metrics.py: one `observe` per engine output (TTFT/ITL/E2E histograms) and one render per
  /metrics scrape, against prometheus_client's Histogram plus a custom collector for the engine
  snapshot (the way an exporter of cumulative counters uses it), rendered by `generate_latest`;
- loadgen/run/spec_decode.py `parse_spec_counters` (two counters per scrape, loadgen must stay light) against
  prometheus_client's parser;
- the import time prometheus_client would add (fresh interpreters, with and without it).

Both sides render the same families, labels and buckets from the same data; the script checks
that the parsed values agree before timing anything.

Needs prometheus_client, which agentload itself does not depend on (`pip install prometheus_client`).
Result and decision: benchmarks/RESULTS.md.

    PYTHONPATH=. python benchmarks/metrics_exposition.py            # full run (about a minute)
    PYTHONPATH=. python benchmarks/metrics_exposition.py --smoke    # a few iterations: tests the script
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from loadgen.run.spec_decode import METRIC_ACCEPTED, METRIC_DRAFTS, parse_spec_counters
from server.engine.messages import EngineStats
from server.metrics import _ENGINE_COUNTERS, _ENGINE_GAUGES, E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS, ServerMetrics

MODEL = "tiny"
FINISH_REASONS = ("length", "stop", "abort", "error")
REJECT_CODES = ("overloaded", "invalid_value", "context_length_exceeded")


def engine_stats() -> EngineStats:
    return EngineStats(num_running=12, num_waiting=3, kv_cache_usage=0.4375, prefix_cache_queries=912_345,
                       prefix_cache_hits=700_001, num_preemptions=4, prompt_tokens=1_234_567,
                       generation_tokens=345_678, spec_num_drafts=50_000, spec_num_draft_tokens=150_000,
                       spec_num_accepted_tokens=120_000, spec_accepted_per_position=(45_000, 40_000, 35_000))


def observations(n: int, seed: int = 0) -> list[tuple[float, float, float]]:
    rng = random.Random(seed)
    return [(rng.lognormvariate(-2.5, 1.0), rng.lognormvariate(-4.0, 0.7), rng.lognormvariate(1.0, 1.0))
            for _ in range(n)]


class Hand:
    """server/metrics.py as the API process uses it."""

    def __init__(self) -> None:
        self.metrics = ServerMetrics(MODEL)

    def observe(self, ttft: float, itl: float, e2e: float) -> None:
        self.metrics.ttft.observe(ttft)
        self.metrics.itl.observe(itl)
        self.metrics.e2e.observe(e2e)

    def finish(self, reason: str) -> None:
        self.metrics.observe_finished(reason)

    def reject(self, code: str) -> None:
        self.metrics.observe_rejected(code)

    def render(self, stats: EngineStats) -> bytes:
        return self.metrics.render(stats, 7)


class Client:
    """The same exposition on prometheus_client: histograms and labelled counters as metric
    objects, the engine snapshot and the in-flight gauge through a collector at scrape time."""

    def __init__(self) -> None:
        import prometheus_client as pc
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        pc.disable_created_metrics()
        self.pc = pc
        self.registry = pc.CollectorRegistry(auto_describe=False)
        labels = ["model_name"]
        self.ttft = pc.Histogram("vllm:time_to_first_token_seconds", "Request arrival to first token.", labels,
                                 buckets=TTFT_BUCKETS, registry=self.registry).labels(MODEL)
        self.itl = pc.Histogram("vllm:inter_token_latency_seconds", "Gap between consecutive engine outputs.",
                                labels, buckets=ITL_BUCKETS, registry=self.registry).labels(MODEL)
        self.e2e = pc.Histogram("vllm:e2e_request_latency_seconds", "Request arrival to last token.", labels,
                                buckets=E2E_BUCKETS, registry=self.registry).labels(MODEL)
        self.success = pc.Counter("vllm:request_success", "Requests finished, by finish reason.",
                                  [*labels, "finished_reason"], registry=self.registry)
        self.rejected = pc.Counter("agentload:requests_rejected", "Requests refused before the engine.",
                                   [*labels, "code"], registry=self.registry)
        self.stats = EngineStats()
        outer = self

        class Snapshot:
            def collect(self):
                for name, field, help_text in _ENGINE_GAUGES:
                    family = GaugeMetricFamily(name, help_text, labels=labels)
                    family.add_metric([MODEL], getattr(outer.stats, field))
                    yield family
                for name, field, help_text in _ENGINE_COUNTERS:
                    family = CounterMetricFamily(name.removesuffix("_total"), help_text, labels=labels)
                    family.add_metric([MODEL], getattr(outer.stats, field))
                    yield family
                family = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                             "Draft tokens accepted at each draft position.",
                                             labels=[*labels, "position"])
                for pos, n in enumerate(outer.stats.spec_accepted_per_position):
                    family.add_metric([MODEL, str(pos)], n)
                yield family
                family = GaugeMetricFamily("agentload:api_requests_in_flight", "Requests in the API.", labels=labels)
                family.add_metric([MODEL], 7)
                yield family

        self.registry.register(Snapshot())

    def observe(self, ttft: float, itl: float, e2e: float) -> None:
        self.ttft.observe(ttft)
        self.itl.observe(itl)
        self.e2e.observe(e2e)

    def finish(self, reason: str) -> None:
        self.success.labels(MODEL, reason).inc()

    def reject(self, code: str) -> None:
        self.rejected.labels(MODEL, code).inc()

    def render(self, stats: EngineStats) -> bytes:
        self.stats = stats
        return self.pc.generate_latest(self.registry)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def parse_with_client(text: str) -> tuple[int, int] | None:
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in (METRIC_DRAFTS, METRIC_ACCEPTED):
                totals[s.name] = totals.get(s.name, 0.0) + s.value
    if len(totals) < 2:
        return None
    return int(totals[METRIC_DRAFTS]), int(totals[METRIC_ACCEPTED])


def per_call_us(fn: Callable[[], object], calls: int, repeats: int) -> float:
    """Median over `repeats` of the mean time of one call, in microseconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def import_ms(modules: str, samples_n: int) -> float:
    """Median wall time, in ms, of a fresh interpreter that imports `modules` (comma-separated)."""
    def run() -> float:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {modules}"], check=True)
        return time.perf_counter() - start

    return statistics.median(run() for _ in range(samples_n)) * 1e3


def fill(side: Hand | Client, obs: list[tuple[float, float, float]]) -> None:
    for i, o in enumerate(obs):
        side.observe(*o)
        side.finish(FINISH_REASONS[i % len(FINISH_REASONS)])
        if i % 50 == 0:
            side.reject(REJECT_CODES[i % len(REJECT_CODES)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a few iterations, to test the script")
    args = parser.parse_args(argv)
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        print("metrics_exposition: error: needs prometheus_client (pip install prometheus_client)", file=sys.stderr)
        return 2
    n_obs, calls, repeats, imports = (200, 20, 3, 2) if args.smoke else (20_000, 2_000, 7, 9)

    obs, stats = observations(n_obs), engine_stats()
    hand, client = Hand(), Client()
    fill(hand, obs)
    fill(client, obs)
    hand_text, client_text = hand.render(stats).decode(), client.render(stats).decode()
    ours, theirs = samples(hand_text), samples(client_text)
    if ours.keys() != theirs.keys() or any(abs(ours[k] - theirs[k]) > 1e-6 * max(1.0, abs(ours[k])) for k in ours):
        diff = sorted(set(ours.items()) ^ set(theirs.items()))[:6]
        print(f"metrics_exposition: error: the two expositions differ: {diff}", file=sys.stderr)
        return 1
    counters = parse_spec_counters(hand_text)
    if counters is None or (counters.num_drafts, counters.num_accepted_tokens) != parse_with_client(hand_text):
        print("metrics_exposition: error: the two parsers disagree", file=sys.stderr)
        return 1

    o = obs[0]
    rows = [
        ("observe (3 histograms, 1 output)", per_call_us(lambda: hand.observe(*o), calls * 10, repeats),
         per_call_us(lambda: client.observe(*o), calls * 10, repeats), "us"),
        ("render one /metrics scrape", per_call_us(lambda: hand.render(stats), calls, repeats),
         per_call_us(lambda: client.render(stats), calls, repeats), "us"),
        ("parse the two spec counters (loadgen)", per_call_us(lambda: parse_spec_counters(hand_text), calls, repeats),
         per_call_us(lambda: parse_with_client(hand_text), calls, repeats), "us"),
    ]
    print(f"{len(hand_text)} bytes per scrape ({hand_text.count(chr(10))} lines); prometheus_client: "
          f"{len(client_text)} bytes")
    print(f"{'what':<40} {'hand-written':>13} {'prometheus_client':>18} {'ratio':>7}")
    for what, mine, theirs_t, unit in rows:
        print(f"{what:<40} {mine:>10.2f} {unit} {theirs_t:>15.2f} {unit} {theirs_t / mine:>6.1f}x")
    # The hand-written code is part of modules both processes import anyway: nothing to add.
    for module in ("prometheus_client", "prometheus_client.parser"):
        added = import_ms(f"server.metrics, {module}", imports) - import_ms("server.metrics", imports)
        print(f"import time prometheus_client would add ({module}): {added:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
