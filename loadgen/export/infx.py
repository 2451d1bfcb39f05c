"""InferenceX rows of results files: the fixed-sequence shape (`--format infx`) and the agentic
AgentX shape (`--format agentx`), one row per closed-loop level, ready for InferenceX's ingest.

Both shapes carry the identity and topology keys (loadgen/export/infx_identity.py), `conc`,
`num_requests_total` and `num_requests_successful` (InferenceX drops a row with no successful
request), and our own provenance under `agentload` (an object, which the ingest never mistakes
for a metric: a bare `failed: true` or a label like "8 users" would be read as a number).

Statistics follow InferenceX's aggregators. Per-request values come from the results file's
request columns, so mean, std (population) and percentiles (linear interpolation between the
two nearest ranks) are exact; the fixed-sequence per-chunk ITL is exact too when the run's
`--per-request` file is given (loadgen/export/infx_itl.py), else it comes from the stored HDR
histogram (3 significant digits); `agentload.itl_from` says which.

Throughput is InferenceX's, not our window's: the counted requests' tokens over the span from the
first one's start to the last one's last chunk (`start_ms` + `e2el_us`), as its agentic aggregation
divides by max(end) - min(start) and its fixed-sequence client by the time from its first request to
its last answer. The span is not our window: it opens with the first counted request, after the
window does, and closes with the last counted request's last chunk, after the window has (the
results file keeps our window's rates; the rows carry the span as `agentload.span_s`).

Fixed-sequence shape (InferenceX's process_result.py over vLLM-style benchmark keys), SECONDS:
`{mean,median,std,p90,p99,p99.9}_{ttft,tpot,itl,e2el}` with
- ttft: request sent -> first content chunk; e2el: request sent -> last chunk;
- tpot: per request (E2EL - TTFT) / (OSL - 1), requests with OSL >= 2;
- itl: the gap between consecutive content chunks, per chunk and NOT divided by the tokens a
  chunk carries (InferenceX's client records it the same way);
- `<stat>_intvty` = 1 / `<stat>_tpot` for every stat, tokens/s/user: percentiles are the slow
  tail, and `std_intvty` is InferenceX's reciprocal of the TPOT std (not a spread);
- isl / osl: the nominal lengths (--isl/--osl, or the run's own when every request had them); a
  level whose mean ISL or OSL is more than LENGTH_TOLERANCE (20 %) from them is refused. InferenceX
  draws each request's lengths uniformly from [0.8 L, L] (benchmark_serving.py's range ratio, 0.8 in
  its workflows), so its own means sit within 20 % of L;
- tput_per_gpu, output_tput_per_gpu, input_tput_per_gpu: tokens / span / GPUs.

AgentX shape (InferenceX's agentic aggregation, schema v3): `scenario_type: agentic-coding`, no
isl/osl, `kv_offloading`, `request_accounting` (whose `records_total`, warmup records included as
InferenceX counts them, is also `num_requests_total`), and `request_metrics` with
- latency.{ttft,e2el,itl,tpot,intvty,e2e_norm_intvty}.{mean,p50,p75,p90,p95,std}, seconds;
  itl is PER REQUEST, (E2EL - TTFT) / (OSL - 1), so tpot holds the same distribution;
  intvty's mean/pX = 1 / itl's mean/pX (slow tail), its std the spread of per-request 1 / itl;
  e2e_norm_intvty the same over E2EL / OSL;
- qps: requests finished per 1 s window, {mean,p50,p75,p90,p95,std, window_seconds, samples};
- tokens.{input,output_actual}: per-request token counts (output_expected is left empty);
- throughput.{input,output,total}.tokens_per_second over the span, duration_seconds (the span),
  and per_gpu.{total,output,input}_tput_tps;
- cache.theoretical_cache_hit_rate (the trace's);
and `server_metrics` (with `kv_cache_pool_tokens`) from the level's /metrics series, as
loadgen/export/infx_server.py says; the hit rate servers report through usage cached tokens
goes to our provenance (`agentload.usage_cache_hit_rate`).
Floats are rounded to 5 decimals, integral ones >= 1 written as integers, as InferenceX does.

Failed levels (InferenceX's validator would refuse their error rate) and open-loop levels (rows
are keyed by concurrency) are left out with a warning.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from loadgen.export.infx_identity import AGENTIC_SCENARIO, ExportError, Identity, IdentityFlags, resolve_identity
from loadgen.export.infx_itl import level_chunk_gaps
from loadgen.export.infx_server import server_metrics_block
from loadgen.report.runs import Run
from loadgen.results.pareto import e2e_interactivity

log = logging.getLogger(__name__)

# fixed-shape key, loadgen's histogram stat; the fixed-shape percentiles by key
FIXED_STATS = (("mean", "mean"), ("median", "p50"), ("std", "std"), ("p90", "p90"), ("p99", "p99"),
               ("p99.9", "p99.9"))
FIXED_PERCENTILES = {"median": 50.0, "p90": 90.0, "p99": 99.0, "p99.9": 99.9}
AGENTIC_PERCENTILES = {"p50": 50.0, "p75": 75.0, "p90": 90.0, "p95": 95.0}
AGENTIC_STATS = ("mean", *AGENTIC_PERCENTILES)
QPS_WINDOW_S = 1.0
DECIMALS = 5
# How far a level's mean ISL or OSL may sit from the nominal --isl/--osl: InferenceX's own runs draw
# lengths from [0.8 L, L] (benchmark_serving.py sample_random_requests, RANDOM_RANGE_RATIO 0.8).
LENGTH_TOLERANCE = 0.20


def infx_rows(runs: Sequence[Run], flags: IdentityFlags, per_request: Sequence[Path] = ()) -> list[dict[str, Any]]:
    """Fixed-sequence rows; `per_request`: the runs' --per-request files, one per run in order, for the
    raw per-chunk ITL (none: the ITL histogram)."""
    if per_request and len(per_request) != len(runs):
        raise ExportError(f"--per-request: one file per results file, in their order ({len(runs)} results "
                          f"files, {len(per_request)} per-request files)")
    gaps = {run.name: level_chunk_gaps(path, run) for run, path in zip(runs, per_request)}
    return _rows(runs, flags, partial(_fixed_row, chunk_gaps=gaps))


def agentx_rows(runs: Sequence[Run], flags: IdentityFlags) -> list[dict[str, Any]]:
    return _rows(runs, flags, _agentic_row)


def write_rows(rows: list[dict[str, Any]], path: Path) -> Path:
    """One JSON array of rows: the shape InferenceX's collector hands to its ingest."""
    path.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    return path


Builder = Callable[[Run, int, Identity, IdentityFlags], dict[str, Any]]  # the row of the run's i-th level


def _rows(runs: Sequence[Run], flags: IdentityFlags, build: Builder) -> list[dict[str, Any]]:
    rows = []
    for run in runs:
        identity = resolve_identity(flags, run.doc, run.name)
        for index, level in enumerate(run.doc["levels"]):
            label = level.get("label") or level["mode"]
            if level["failed"]:
                log.warning("%s %s left out: the level failed (%s)", run.name, label, "; ".join(level["fail_reasons"]))
            elif level["mode"] != "closed" or not level["concurrency"]:
                log.warning("%s %s left out: open loop, and InferenceX rows are keyed by concurrency", run.name, label)
            else:
                rows.append(build(run, index, identity, flags))
    return rows


def _common(run: Run, level: dict[str, Any], identity: Identity) -> dict[str, Any]:
    counts = level["counts"]
    return {**identity.keys(), "conc": int(level["concurrency"]),
            "num_requests_total": counts["requests_ok"] + counts["errors_total"],
            "num_requests_successful": counts["requests_ok"]}


def _provenance(run: Run, level: dict[str, Any], span_s: float) -> dict[str, Any]:
    return {"run": run.name, "results_file": str(run.path), "label": level.get("label"),
            "repeat": level.get("repeat"), "window_s": level["window_s"], "span_s": span_s}


def _span_s(run: Run, level: dict[str, Any]) -> float:
    """InferenceX's throughput duration: the counted requests' last end - first start, in seconds."""
    columns = level["requests"]
    if "start_ms" not in columns:
        raise ExportError(f"{run.name} {level.get('label')}: no start_ms request column (a results file written "
                          "before it was added), and InferenceX's throughput needs each request's start")
    starts = np.asarray(columns["start_ms"], dtype=np.float64) / 1e3
    span = float((starts + np.asarray(columns["e2el_us"], dtype=np.float64) / 1e6).max() - starts.min())
    if span <= 0:
        raise ExportError(f"{run.name} {level.get('label')}: its requests span no time")
    return span


def _per_gpu(level: dict[str, Any], span_s: float, gpus: int) -> dict[str, float]:
    """Tokens per second per GPU over the span, of the counted requests (the request columns)."""
    columns = level["requests"]
    input_tokens, output_tokens = sum(columns["isl"]), sum(columns["osl"])
    return {"input": input_tokens / span_s / gpus, "output": output_tokens / span_s / gpus,
            "total": (input_tokens + output_tokens) / span_s / gpus}


# ---- fixed-sequence shape -------------------------------------------------------------------


def _fixed_row(run: Run, index: int, identity: Identity, flags: IdentityFlags,
               chunk_gaps: dict[str, list[np.ndarray]]) -> dict[str, Any]:
    level = run.doc["levels"][index]
    columns = level["requests"]
    isl, osl = _nominal_lengths(columns, flags, run.name, level)
    span_s = _span_s(run, level)
    per_gpu = _per_gpu(level, span_s, identity.gpus)
    row = {**_common(run, level, identity), "isl": isl, "osl": osl,
           "tput_per_gpu": per_gpu["total"], "output_tput_per_gpu": per_gpu["output"],
           "input_tput_per_gpu": per_gpu["input"]}
    seconds = {name: _seconds(columns[f"{name}_us"]) for name in ("ttft", "tpot", "e2el")}
    if run.name in chunk_gaps:
        itl_from, seconds["itl"] = "per_request_chunks", chunk_gaps[run.name][index]
    else:
        itl_from = "hdr_histogram"
    for name in ("ttft", "tpot", "itl", "e2el"):
        stats = (_stats(seconds[name], FIXED_PERCENTILES) if name in seconds
                 else _histogram_seconds(level["metrics"]["itl"]["stats"]))
        if not stats:
            raise ExportError(f"{run.name} {level.get('label')}: no request has a {name.upper()} "
                              "(every output was a single token or chunk)")
        row.update({f"{key}_{name}": stats[key] for key, _ in FIXED_STATS})
    for key, _ in FIXED_STATS:
        tpot = row[f"{key}_tpot"]
        row[f"{key}_intvty"] = 1.0 / tpot if tpot > 0 else None
    row["agentload"] = {**_provenance(run, level, span_s), "e2e_intvty": e2e_interactivity(level),
                        "itl_from": itl_from}
    return row


def _nominal_lengths(columns: dict[str, list], flags: IdentityFlags, run_name: str,
                     level: dict[str, Any]) -> tuple[int, int]:
    """The nominal ISL and OSL of a level: the flags', or the one length all its requests had. The
    ingest files the row under them, so measured means far from them are refused."""
    lengths, far = [], []
    for flag, name, given in (("--isl", "isl", flags.isl), ("--osl", "osl", flags.osl)):
        seen = set(columns[name])
        if given is None and len(seen) != 1:
            span = f"{min(seen)}..{max(seen)}" if seen else "none"
            raise ExportError(f"{flag}: the fixed-sequence shape needs one nominal {name.upper()}, but "
                              f"{run_name} {level.get('label')} has {span}; pass {flag}, or use --format agentx")
        nominal = given if given is not None else int(seen.pop())
        mean = float(np.mean(columns[name]))
        if abs(mean / nominal - 1) > LENGTH_TOLERANCE:
            far.append(f"{flag} {nominal} but a mean {name.upper()} of {mean:.0f}")
        lengths.append(nominal)
    if far:
        raise ExportError(f"{run_name} {level.get('label')}: {'; '.join(far)}, more than "
                          f"{LENGTH_TOLERANCE:.0%} from the nominal length InferenceX would file the row under; "
                          "pass the lengths the run used, or use --format agentx")
    return lengths[0], lengths[1]


def _histogram_seconds(stats: dict[str, Any]) -> dict[str, float]:
    if not stats.get("count"):
        return {}
    return {key: stats[stat] / 1e6 for key, stat in FIXED_STATS}


# ---- agentic (AgentX v3) shape --------------------------------------------------------------


def _agentic_row(run: Run, index: int, identity: Identity, flags: IdentityFlags) -> dict[str, Any]:
    level = run.doc["levels"][index]
    columns, counts = level["requests"], level["counts"]
    span_s = _span_s(run, level)
    per_gpu, totals = _per_gpu(level, span_s, identity.gpus), _per_gpu(level, span_s, 1)
    accounting = _accounting(counts)
    server = server_metrics_block(level)
    row = {
        **_common(run, level, identity), "scenario_type": AGENTIC_SCENARIO,
        "kv_offloading": "none", "kv_offload_backend": None, "allocated_cpu_dram_gb": 0,
        "num_requests_total": accounting["records_total"],  # InferenceX counts warmup records too
        "request_accounting": accounting,
        "request_metrics": {
            "qps": _qps(columns),
            "latency": _latency(columns),
            "tokens": {"input": _distribution(np.asarray(columns["isl"], dtype=np.float64)),
                       "output_actual": _distribution(np.asarray(columns["osl"], dtype=np.float64)),
                       "output_expected": {}},
            "throughput": {
                "input": {"tokens_per_second": totals["input"]},
                "output": {"tokens_per_second": totals["output"]},
                "total": {"tokens_per_second": totals["total"]},
                "duration_seconds": span_s,
                "per_gpu": {"total_tput_tps": per_gpu["total"], "output_tput_tps": per_gpu["output"],
                            "input_tput_tps": per_gpu["input"]},
            },
            "cache": {"theoretical_cache_hit_rate": level["cache"].get("trace_theoretical_hit_rate")},
        },
        "server_metrics": server,
        "kv_cache_pool_tokens": server["kv_cache"]["gpu_total_tokens"],  # InferenceX copies it to the top
        "agentload": {**_provenance(run, level, span_s),
                      "usage_cache_hit_rate": level["cache"].get("measured_hit_rate")},
    }
    return _rounded(row)


def _accounting(counts: dict[str, Any]) -> dict[str, Any]:
    """InferenceX's request accounting: warmup and errored records are counted, not measured."""
    warmup_errors = sum(counts.get("warmup_errors", {}).values())
    warmup = counts.get("warmup_requests_ok", 0) + warmup_errors
    categories: dict[str, int] = {}
    for source in (counts.get("errors", {}), counts.get("warmup_errors", {})):
        for kind, n in source.items():
            categories[kind] = categories.get(kind, 0) + n
    total = counts["requests_ok"] + counts["errors_total"] + warmup
    return {"records_total": total, "records_profiled": counts["requests_ok"],
            "records_dropped_total": total - counts["requests_ok"], "records_warmup_dropped": warmup,
            "records_error_dropped": counts["errors_total"] + warmup_errors, "error_categories": categories}


def _latency(columns: dict[str, list]) -> dict[str, dict[str, float]]:
    ttft, e2el, itl = (_seconds(columns[f"{name}_us"]) for name in ("ttft", "e2el", "tpot"))
    osl = np.asarray(columns["osl"], dtype=np.float64)
    e2el_all = np.asarray([v if v is not None else np.nan for v in columns["e2el_us"]], dtype=np.float64) / 1e6
    usable = (osl > 0) & (e2el_all > 0)
    per_token = e2el_all[usable] / osl[usable]
    return {"ttft": _distribution(ttft), "e2el": _distribution(e2el), "itl": _distribution(itl),
            "tpot": _distribution(itl), "intvty": _reciprocal(itl), "e2e_norm_intvty": _reciprocal(per_token)}


def _distribution(values: np.ndarray) -> dict[str, float]:
    """The agentic shape's mean, p50, p75, p90, p95 and std."""
    return _stats(values, AGENTIC_PERCENTILES)


def _stats(values: np.ndarray, percentiles: dict[str, float]) -> dict[str, float]:
    """mean, the named percentiles and the population std; {} without values (as InferenceX)."""
    if values.size == 0:
        return {}
    out = {"mean": float(values.mean())}
    out.update({name: float(q) for name, q in zip(percentiles, np.percentile(values, list(percentiles.values())))})
    out["std"] = float(values.std())
    return out


def _reciprocal(latencies: np.ndarray) -> dict[str, float]:
    """Slow-tail interactivity: stat = 1 / the latency's stat; std over per-request 1 / latency."""
    latencies = latencies[latencies > 0]
    stats = _distribution(latencies)
    out = {stat: 1.0 / stats[stat] for stat in AGENTIC_STATS if stats.get(stat, 0) > 0}
    if latencies.size:
        out["std"] = float((1.0 / latencies).std()) if latencies.size > 1 else 0.0
    return out


def _qps(columns: dict[str, list]) -> dict[str, Any]:
    """Completions per 1 s window from the first finish to the last (InferenceX's QPS)."""
    starts = columns.get("start_ms")
    if not starts or len(starts) < 2:
        return {}
    ends = np.sort(np.asarray(starts, dtype=np.float64) / 1e3 + np.asarray(columns["e2el_us"], dtype=np.float64) / 1e6)
    if ends[-1] - ends[0] <= 0:
        return {}
    lows = np.arange(ends[0], ends[-1] - QPS_WINDOW_S + 1e-12, QPS_WINDOW_S)
    counts = (np.searchsorted(ends, lows + QPS_WINDOW_S, side="left")
              - np.searchsorted(ends, lows, side="left")) / QPS_WINDOW_S
    if counts.size:
        stats = _distribution(counts.astype(np.float64))
    else:  # under one window: InferenceX's mean over the whole span
        stats = {"mean": float(len(ends) / (ends[-1] - ends[0]))}
    return {"window_seconds": QPS_WINDOW_S, "samples": int(counts.size), **stats}


def _seconds(microseconds: list) -> np.ndarray:
    return np.asarray([v for v in microseconds if v is not None and v > 0], dtype=np.float64) / 1e6


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        value = float(value)  # numpy's float64 is a float, but not one JSON writers take
        if not math.isfinite(value):
            return value
        rounded = round(value, DECIMALS)
        return int(rounded) if abs(rounded) >= 1 and rounded.is_integer() else rounded
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_rounded(item) for item in value]
    return value
