"""Terminal table of one level's results (the results-file entry, see results.py)."""

from __future__ import annotations

from typing import Any

# (metric, label, divisor to the shown unit, shown unit)
ROWS = (
    ("ttft", "TTFT", 1000, "ms"),
    ("itl", "ITL", 1000, "ms"),
    ("tpot", "TPOT", 1000, "ms"),
    ("interactivity", "interactivity (slow tail)", 1, "tok/s"),
    ("e2el", "E2EL", 1000, "ms"),
    ("norm_e2el", "E2EL / OSL", 1000, "ms/tok"),
    ("tokens_per_chunk", "tokens per chunk", 1, "tok"),
    ("queue_delay", "client queue delay", 1000, "ms"),
    ("loop_lag", "client loop lag", 1000, "ms"),
)
COLUMNS = ("mean", "p50", "p90", "p95", "p99", "p99.9", "max")


def format_level(level: dict[str, Any]) -> str:
    counts, tput, cache = level["counts"], level["throughput"], level["cache"]
    errors = ", ".join(f"{kind} {n}" for kind, n in sorted(counts["errors"].items())) or "none"
    lines = [
        f"== {level['label']}: window {level['window_s']:.1f} s, {counts['requests_ok']} requests ok, "
        f"errors: {errors} ({counts['error_rate']:.1%})",
        f"   {tput['requests_per_s']:.2f} req/s | output {tput['output_tokens_per_s']:.1f} tok/s "
        f"({tput['output_tokens_per_s_per_gpu']:.1f}/GPU, {tput['gpus']} GPU) | input "
        f"{tput['input_tokens_per_s']:.1f} tok/s | total {tput['total_tokens_per_s']:.1f} tok/s",
    ]
    if (line := _inflight_line(level)) is not None:
        lines.append(line)
    header = f"   {'metric':<26}{'unit':>7}" + "".join(f"{c:>10}" for c in COLUMNS)
    lines.append(header)
    for name, label, divisor, unit in ROWS:
        stats = level["metrics"][name]["stats"]
        if not stats["count"]:
            continue
        cells = "".join(_cell(stats[c], divisor) for c in COLUMNS)
        lines.append(f"   {label:<26}{unit:>7}{cells}")
    lines.append("   interactivity pX = 1 / pX(TPOT): the slow tail (its 'max' is the fastest user)")
    if cache["cached_tokens"] is not None:
        lines.append(f"   cache: {cache['measured_hit_rate']:.1%} of input tokens served from the server's "
                     f"prefix cache (trace's theoretical {_pct(cache['trace_theoretical_hit_rate'])})")
    elif cache["trace_theoretical_hit_rate"] is not None:
        lines.append(f"   cache: server reports no cached tokens (trace's theoretical hit rate "
                     f"{_pct(cache['trace_theoretical_hit_rate'])})")
    if level.get("spec_decode"):
        lines.append(_spec_line(level["spec_decode"]))
    if counts["usage_mismatch_requests"]:
        lines.append(f"   note: {counts['usage_mismatch_requests']} requests reported a token count in usage "
                     f"that differs from the streamed chunks ({counts['output_tokens']} vs "
                     f"{counts['output_tokens_counted']} tokens)")
    for warning in level["client"]["warnings"]:
        lines.append(f"   WARNING: {warning}")
    if compiles := counts.get("server_kernel_compiles"):  # absent in results of earlier versions
        lines.append(f"   WARNING: the server compiled {compiles} Triton kernel(s) during the window "
                     "(agentload:kernel_compiles_total): the requests of those steps waited, and the latency "
                     "tails include it")
    if level["failed"]:
        lines.append(f"   FAILED: {'; '.join(level['fail_reasons'])}")
    return "\n".join(lines)


def _inflight_line(level: dict[str, Any]) -> str | None:
    """Requests in flight on average over the window; for a closed loop, as a share of its lanes
    (the rest of their time was think time or the client between requests)."""
    mean = level["counts"].get("mean_inflight_requests")  # absent in results of earlier versions
    if mean is None:
        return None
    line = f"   in flight: {mean:.2f} requests on average over the window"
    if level["mode"] == "closed" and level["concurrency"]:
        conc = level["concurrency"]
        line += f" ({mean / conc:.1%} of the lanes' time at conc {conc}; the rest: think time)"
    return line


def _spec_line(spec: dict[str, Any]) -> str:
    """Measured acceptance length beside the golden (expected) one."""
    measured = "n/a (no usage.spec_decode, no /metrics counters)" if spec["measured_al"] is None else (
        f"{spec['measured_al']:.3f} (from {spec['measured_from']})")
    expected = "n/a" if spec["expected_al"] is None else f"{spec['expected_al']:.3f}"
    where = f"k={spec['k']}" if spec["k"] is not None else "k unknown"
    if spec["golden_al"]:
        where += f", {spec['golden_al']}"
    return f"   speculative decoding: acceptance length measured {measured} | golden {expected} ({where})"


def _cell(value: float | int | None, divisor: float) -> str:
    if value is None:
        return f"{'-':>10}"
    shown = value / divisor
    return f"{shown:>10.3f}" if shown < 1000 else f"{shown:>10.0f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"
