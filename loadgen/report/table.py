"""Terminal table of one level's results (the results-file entry, see loadgen/results/file.py): its statistics,
its SLO lines, its latencies by context bucket and its sessions line; the SLO and sessions texts are
shared with the HTML report."""

from __future__ import annotations

from typing import Any

from loadgen.results.metric_registry import METRIC_BY_NAME, Metric

# the table's rows, in the order it shows them; label, unit and scale are the registry's
ROWS = tuple(METRIC_BY_NAME[name] for name in ("ttft", "itl", "tpot", "interactivity", "e2el", "norm_e2el",
                                               "tokens_per_chunk", "queue_delay", "loop_lag"))
COLUMNS = ("mean", "p50", "p90", "p95", "p99", "p99.9", "max")
# (label, unit, row key, statistic) of a by-context or by-turn row (loadgen/results/turns.py)
BREAKDOWN = (("TTFT p50", "ms", "ttft_ms", "p50"), ("TTFT p90", "ms", "ttft_ms", "p90"),
             ("TPOT p50", "ms", "tpot_ms", "p50"), ("E2EL p90", "s", "e2el_s", "p90"))


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
    for metric in ROWS:
        stats = level["metrics"][metric.name]["stats"]
        if not stats["count"]:
            continue
        cells = "".join(_cell(shown(metric, stats[c])) for c in COLUMNS)
        lines.append(f"   {metric.label:<26}{metric.shown_unit:>7}{cells}")
    lines.append("   interactivity pX = 1 / pX(TPOT): the slow tail (its 'max' is the fastest user)")
    if cache["cached_tokens"] is not None:
        lines.append(f"   cache: {cache['measured_hit_rate']:.1%} of input tokens served from the server's "
                     f"prefix cache (trace's theoretical {_pct(cache['trace_theoretical_hit_rate'])})")
    elif cache["trace_theoretical_hit_rate"] is not None:
        lines.append(f"   cache: server reports no cached tokens (trace's theoretical hit rate "
                     f"{_pct(cache['trace_theoretical_hit_rate'])})")
    if level.get("server_metrics"):  # absent in results of earlier versions and with scraping off
        lines.append(server_text(level["server_metrics"]))
    if level.get("gpu"):  # absent in results of earlier versions
        lines.append(gpu_text(level["gpu"]))
    if level.get("spec_decode"):
        lines.append(_spec_line(level["spec_decode"]))
    lines += [f"   {slo_text(entry)}" for entry in level.get("slo") or ()]  # absent in results of earlier versions
    if turns := level.get("turns"):
        lines += _turns_lines(turns)
    if counts["usage_mismatch_requests"]:
        lines.append(f"   note: {counts['usage_mismatch_requests']} requests reported a token count in usage "
                     f"that differs from the streamed chunks ({counts['output_tokens']} vs "
                     f"{counts['output_tokens_counted']} tokens)")
    for warning in level["client"]["warnings"]:
        lines.append(f"   WARNING: {warning}")
    if (line := _cache_warning(cache)) is not None:
        lines.append(line)
    if compiles := counts.get("server_kernel_compiles"):  # absent in results of earlier versions
        lines.append(f"   WARNING: the server compiled {compiles} Triton kernel(s) during the window "
                     "(agentload:kernel_compiles_total): the requests of those steps waited, and the latency "
                     "tails include it")
    if level["failed"]:
        lines.append(f"   FAILED: {'; '.join(level['fail_reasons'])}")
    return "\n".join(lines)


# A fresh server's cache misses about as many tokens as the trace cannot share; far fewer misses
# mean it held the window's prompts before.
CACHE_MISSES_EXPECTED = 2 / 3


def _cache_warning(cache: dict) -> str | None:
    measured, theoretical = cache["measured_hit_rate"], cache["trace_theoretical_hit_rate"]
    if measured is None or theoretical is None or theoretical >= 1:
        return None
    if 1 - measured >= CACHE_MISSES_EXPECTED * (1 - theoretical):
        return None
    return (f"   WARNING: the server's prefix cache served {measured:.1%} of the input tokens, more than the "
            f"trace shares ({theoretical:.1%}): it held this level's prompts from before its window, most "
            "likely from an earlier run with the same --seed against this server (restart the server or "
            "change --seed); the window measured a lighter load than the trace's")


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


def _turns_lines(turns: dict[str, Any]) -> list[str]:
    """The by-context rows (the agentic curve: latency as the context grows) and the sessions line."""
    heads = "".join(f"{f'{label} ({unit})':>15}" for label, unit, _, _ in BREAKDOWN)
    lines = [f"   {'context (tokens)':<18}{'requests':>10}{heads}"]
    for row in turns["by_context"]:
        lines.append(f"   {row['label']:<18}{row['requests']:>10}"
                     + "".join(_cell(row[key][stat], 15) for _, _, key, stat in BREAKDOWN))
    return [*lines, f"   {sessions_text(turns['sessions'])}"]


def sessions_text(sessions: dict[str, Any]) -> str:
    """'sessions: 12 plays measured, 3 whole; wall time p50 .. s, p90 .. s; good share mean .., p10 ..'."""
    text = f"sessions: {sessions['count']} plays measured"
    if sessions["whole_count"] is not None:
        text += f", {sessions['whole_count']} whole"
    if (wall := sessions["wall_s"]) and wall["p50"] is not None:
        text += f"; wall time p50 {wall['p50']:.1f} s, p90 {wall['p90']:.1f} s"
    if (share := sessions["good_share"]) and share["mean"] is not None:
        text += f"; good share mean {_percent(share['mean'])}, p10 {_percent(share['p10'])}"
    return text


def slo_text(entry: dict[str, Any]) -> str:
    """One SLO entry of a level on one line: request and session attainment with their intervals,
    the verdict against the target, goodput and the bound broken most."""
    return (f"SLO {entry['name']} ({slo_bounds(entry)}): {attainment_text(entry['requests'], 'requests')} "
            f"({slo_verdict(entry)}), {attainment_text(entry['sessions'], 'sessions')}; "
            f"goodput {goodput_text(entry['goodput'])}; most violated: {worst_text(entry)}")


def slo_bounds(entry: dict[str, Any]) -> str:
    return ", ".join(part.strip() for part in entry["spec"].split(","))


def attainment_text(part: dict[str, Any], noun: str | None = None) -> str:
    """'97.1 % of requests [95.0, 98.3]': the good share and its interval, in percent."""
    share = "n/a" if part["attainment"] is None else _percent(part["attainment"])
    text = share if noun is None else f"{share} of {noun}"
    if interval := part["interval"]:
        text += f" [{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]"
    return text


def slo_verdict(entry: dict[str, Any]) -> str:
    """The request attainment against the target: met (the interval's lower end reaches it), not
    met (its upper end is below), or undecided (the interval straddles it)."""
    met = entry["requests"]["met"]
    return f"target {100 * entry['target']:g} %: " + ("undecided" if met is None else "met" if met else "not met")


def goodput_text(goodput: dict[str, Any]) -> str:
    return f"{goodput['requests_per_s']:.2f} req/s, {goodput['output_tokens_per_s_per_gpu']:.1f} output tok/s/GPU"


def worst_text(entry: dict[str, Any]) -> str:
    worst = entry["worst"]
    return "none" if worst is None else f"{worst} ({entry['violations'][worst]})"


def _spec_line(spec: dict[str, Any]) -> str:
    """Measured acceptance length beside the golden (expected) one."""
    measured = "n/a (no usage.spec_decode, no /metrics counters)" if spec["measured_al"] is None else (
        f"{spec['measured_al']:.3f} (from {spec['measured_from']})")
    expected = "n/a" if spec["expected_al"] is None else f"{spec['expected_al']:.3f}"
    where = f"k={spec['k']}" if spec["k"] is not None else "k unknown"
    if spec["golden_al"]:
        where += f", {spec['golden_al']}"
    return f"   speculative decoding: acceptance length measured {measured} | golden {expected} ({where})"


def shown(metric: Metric, value: float | int | None) -> float | None:
    """A statistic of the metric (in its results-file unit) in the table's unit."""
    return None if value is None else value / (1 / metric.scale)  # a divisor: 1000, as exact as the unit


def _cell(value: float | int | None, width: int = 10) -> str:
    if value is None:
        return f"{'-':>{width}}"
    return f"{value:>{width}.3f}" if value < 1000 else f"{value:>{width}.0f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _percent(share: float) -> str:
    """A share as the SLO lines write it: '97.1 %'."""
    return f"{100 * share:.1f} %"


def server_text(metrics: dict[str, Any]) -> str:
    """The server's own view of the window, from its /metrics series (loadgen/telemetry/series.py)."""
    window = metrics["window"]
    parts = []
    for name, label in (("running", "running"), ("waiting", "waiting"), ("kv_cache_usage", "KV cache")):
        stats = window.get(name)
        if stats:
            scale, unit = (100, " %") if name == "kv_cache_usage" else (1, "")
            parts.append(f"{label} {stats['mean'] * scale:.1f}{unit} mean, {stats['max'] * scale:.1f}{unit} max")
    if window.get("prefix_cache_hit_rate") is not None:
        parts.append(f"prefix-cache hits {window['prefix_cache_hit_rate']:.1%} of queried tokens")
    if window.get("preemptions") is not None:
        parts.append(f"{window['preemptions']:g} preemptions")
    adapter = metrics["adapter"] or "unknown engine"
    scrapes = f"{metrics['scrapes']} scrapes ({adapter})"
    if metrics["failed_scrapes"]:
        scrapes += f", {metrics['failed_scrapes']} failed: {metrics['errors'][0] if metrics['errors'] else ''}"
    return f"   server: {'; '.join(parts) or 'no known quantity'} | {scrapes}"


def gpu_text(gpu: dict[str, Any]) -> str:
    """Energy over the window from the GPU telemetry (loadgen/telemetry/gpu.py), or why there is none."""
    if gpu.get("energy_j") is None:
        why = (gpu.get("missing") or ["no reading"])[0]
        return f"   GPU energy: not measured ({why if len(why) <= 100 else why[:99] + '…'})"
    line = (f"   GPU energy: {gpu['energy_j']:.0f} J over the window, {gpu['avg_watts_per_gpu']:.0f} W per GPU "
            f"({len(gpu['gpus'])} GPU{'s' if len(gpu['gpus']) != 1 else ''})")
    for key, unit in (("joules_per_output_token", "J per output token"), ("joules_per_request", "J per request"),
                      ("output_tokens_per_s_per_kw", "output tok/s per kW")):
        if gpu.get(key) is not None:
            line += f"; {gpu[key]:.4g} {unit}"
    return line
