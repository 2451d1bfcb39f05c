"""InferenceX's ingest of a result row and its aggregators' statistics, restated for the tests from
upstream's code, not from our schemas or exporter:

- `ingest(row)`: the app's row mapper (SemiAnalysisAI/InferenceX-app packages/db/src/etl:
  benchmark-mapper.ts mapBenchmarkRow, agentic-v3-flatten.ts flattenAgenticAggRow, normalizers.ts,
  full-response-interactivity.ts preferFullResponseMetrics). It returns the stored point, or the
  reason the row is skipped. Server metrics are out of it: the app recomputes them from the run's
  scrape CSV and server logs, which a row does not carry (agentx-server-metrics/db.ts).
- `agentic_stats` / `fixed_stats`: what InferenceX's aggregators compute from per-request data
  (InferenceX utils/agentic/aggregation/request_metrics.py and aggregation_common.py for AgentX rows;
  for fixed-sequence rows its benchmark_serving statistics in milliseconds, which
  utils/process_result.py turns into seconds and `*_intvty` = 1000 / `*_tpot_ms`), keyed as the
  ingest stores them.
"""

from __future__ import annotations

import math
import re
import statistics
from typing import Any

import numpy as np

# packages/constants (GPU_KEYS, the DB model keys) and normalizers.ts (PREFIX_ALIASES, PRECISION_SUFFIX)
GPU_KEYS = {"h100", "h200", "b200", "b300", "gb200", "gb300", "mi300x", "mi325x", "mi355x"}
MODEL_KEYS = {"dsr1", "gptoss120b", "llama70b", "qwen3.5", "kimik2.5", "kimik3", "minimaxm3", "glm5.2", "dsv4"}
PREFIX_ALIASES = {"gptoss": "gptoss120b", "dsv4pro": "dsv4", "kimik2.7": "kimik2.7-code"}
PRECISION_SUFFIX = re.compile(r"-(?:fp4|fp8|mxfp4|nvfp4)(?:-.*)?$", re.IGNORECASE)
# benchmark-mapper.ts: fields that are identity, routing or structure, never metrics
NON_METRIC_KEYS = {
    "hw", "model", "framework", "precision", "infmax_model_prefix", "isl", "osl", "conc", "image",
    "recipe_fingerprint", "recipe-fingerprint", "result_schema_version", "disagg", "is_multinode", "spec_decoding",
    "tp", "ep", "dp_attention", "prefill_tp", "prefill_ep", "prefill_dp_attention", "prefill_num_workers",
    "decode_tp", "decode_ep", "decode_dp_attention", "decode_num_workers", "num_gpus", "num_prefill_gpu",
    "num_decode_gpu", "num_aggregate_gpu", "scenario_type", "users", "offload_mode", "num_requests_total",
    "num_requests_successful", "kv_offloading", "kv_offload_backend", "kv_p2p_transfer", "router",
    "request_metrics", "server_metrics", "dataset", "workers", "power_invalid_reasons", "power_audit",
    "benchmark_outcome",
}
# agentic-v3-flatten.ts
STAT_NAMES = {"mean": "mean", "p50": "median", "median": "median", "p75": "p75", "p90": "p90", "p95": "p95",
              "p99": "p99", "p99.9": "p99.9", "std": "std"}
LATENCY = ("ttft", "e2el", "itl", "tpot", "intvty")
TOKENS = {"input": "input_tokens", "output_actual": "output_tokens_actual", "output_expected": "output_tokens_expected"}
SCALARS = {
    ("throughput", "input", "tokens_per_second"): "input_tput_tps",
    ("throughput", "output", "tokens_per_second"): "output_tput_tps",
    ("throughput", "total", "tokens_per_second"): "total_tput_tps",
    ("throughput", "duration_seconds"): "duration_seconds",
    ("throughput", "per_gpu", "total_tput_tps"): "tput_per_gpu",
    ("throughput", "per_gpu", "output_tput_tps"): "output_tput_per_gpu",
    ("throughput", "per_gpu", "input_tput_tps"): "input_tput_per_gpu",
    ("cache", "theoretical_cache_hit_rate"): "theoretical_cache_hit_rate",
}
FULL_RESPONSE_STATS = ("mean", "median", "p75", "p90", "p95", "p99", "p99.9")
PERCENTILES = {"p50": 50, "p75": 75, "p90": 90, "p95": 95}


def parse_num(value: Any) -> float | None:
    """normalizers.ts parseNum: JavaScript's Number() of a non-string, parseFloat of a string; NaN is none."""
    if value is None or isinstance(value, dict):
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, list):
        return 0.0 if not value else parse_num(value[0]) if len(value) == 1 else None
    match = re.match(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", str(value))
    return float(match.group(0)) if match else None


def ingest(row: dict[str, Any]) -> dict[str, Any] | str:
    """The stored point of a row, or why the ingest skips it."""
    row = {**row, **_flatten(row)}
    if (row.get("benchmark_outcome") or {}).get("status") == "failed":
        return "failed run"
    model = _model_key(row)
    if model is None:
        return f"unmapped model {row.get('infmax_model_prefix') or row.get('model')!r}"
    gpu = str(row.get("hw", "")).lower().split(":")[-1].split("-")[0]
    if gpu not in GPU_KEYS:
        return f"unmapped hw {row.get('hw')!r}"
    agentic = str(row.get("scenario_type", "")).startswith("agentic")
    isl, osl = (None, None) if agentic else (_int(row.get("isl")), _int(row.get("osl")))
    conc = _int(row.get("users")) if agentic and row.get("users") is not None else _int(row.get("conc"))
    if not conc or (not agentic and (not isl or not osl)):
        return "no isl/osl/conc"
    if row.get("num_requests_successful") == 0 and isinstance(row.get("num_requests_total"), int):
        return "failed run (no successful request)"
    metrics = {key: number for key, value in row.items()
               if key not in NON_METRIC_KEYS and (number := parse_num(value)) is not None}
    if agentic:
        metrics = _prefer_full_response(metrics)
        for stat in FULL_RESPONSE_STATS:
            itl = metrics.get(f"{stat}_itl")
            if isinstance(itl, float) and itl > 0:
                metrics[f"{stat}_intvty"] = 1 / itl
            else:
                metrics.pop(f"{stat}_intvty", None)
    return {"model": model, "hardware": gpu, "type": "agentic_traces" if agentic else "single_turn",
            "isl": isl, "osl": osl, "conc": conc, "metrics": metrics}


def agentic_stats(level: dict[str, Any], gpus: int) -> dict[str, float]:
    """InferenceX's AgentX statistics of a level's counted requests, as the ingest keys them."""
    columns = level["requests"]
    out: dict[str, float] = {}
    for name, key in (("ttft", "ttft_us"), ("e2el", "e2el_us"), ("itl", "tpot_us"), ("tpot", "tpot_us")):
        out.update(_stats_for(name, [v / 1e6 for v in columns[key] if v is not None and v > 0]))
    out.update({f"{stat}_intvty": 1 / out[f"{stat}_itl"] for stat in ("mean", "median", "p75", "p90", "p95")})
    itls = [v / 1e6 for v in columns["tpot_us"] if v is not None and v > 0]
    out["std_intvty"] = statistics.pstdev([1 / v for v in itls]) if len(itls) > 1 else 0.0
    out.update(_stats_for("input_tokens", [float(v) for v in columns["isl"]]))
    out.update(_stats_for("output_tokens_actual", [float(v) for v in columns["osl"]]))
    starts = [s / 1e3 for s in columns["start_ms"]]
    ends = sorted(s + e / 1e6 for s, e in zip(starts, columns["e2el_us"]))
    duration = max(ends) - min(starts)
    totals = {"input": sum(columns["isl"]), "output": sum(columns["osl"])}
    out.update(input_tput_tps=totals["input"] / duration, output_tput_tps=totals["output"] / duration,
               total_tput_tps=(totals["input"] + totals["output"]) / duration, duration_seconds=duration,
               tput_per_gpu=(totals["input"] + totals["output"]) / duration / gpus,
               output_tput_per_gpu=totals["output"] / duration / gpus,
               input_tput_per_gpu=totals["input"] / duration / gpus)
    out.update(_qps(ends))
    return out


def fixed_stats(level: dict[str, Any], chunk_gaps_s: np.ndarray, gpus: int) -> dict[str, float]:
    """InferenceX's fixed-sequence statistics (benchmark_serving in ms, then process_result.py)."""
    columns = level["requests"]
    per_request = {"ttft": [v / 1e3 for v in columns["ttft_us"]], "e2el": [v / 1e3 for v in columns["e2el_us"]],
                   "tpot": [v / 1e3 for v in columns["tpot_us"] if v is not None],
                   "itl": list(chunk_gaps_s * 1e3)}
    out: dict[str, float] = {}
    for name, values_ms in per_request.items():
        values = np.asarray(values_ms)
        stats = {"mean": values.mean(), "median": np.median(values), "std": values.std()}
        stats.update({f"p{p:g}": np.percentile(values, p) for p in (90, 99, 99.9)})
        for stat, value_ms in stats.items():
            out[f"{stat}_{name}"] = float(value_ms) / 1000.0
            if name == "tpot":
                out[f"{stat}_intvty"] = 1000.0 / float(value_ms)
    starts = np.asarray(columns["start_ms"]) / 1e3
    duration = float((starts + np.asarray(columns["e2el_us"]) / 1e6).max() - starts.min())
    total, output = sum(columns["isl"]) + sum(columns["osl"]), sum(columns["osl"])
    out.update(tput_per_gpu=total / duration / gpus, output_tput_per_gpu=output / duration / gpus,
               input_tput_per_gpu=(total - output) / duration / gpus)
    return out


def _flatten(row: dict[str, Any]) -> dict[str, float]:
    metrics = row.get("request_metrics")
    if not isinstance(metrics, dict):
        return {}
    flat: dict[str, float] = {}
    blocks = [((metrics.get("latency") or {}).get(name), name) for name in LATENCY]
    tokens = metrics.get("tokens") or {}
    blocks += [(metrics.get("qps"), "qps")] + [(tokens.get(src), key) for src, key in TOKENS.items()]
    for block, suffix in blocks:
        if isinstance(block, dict):
            for stat, canonical in STAT_NAMES.items():
                number = parse_num(block.get(stat))
                if number is not None:
                    flat[f"{canonical}_{suffix}"] = number
    for path, key in SCALARS.items():
        value: Any = metrics
        for step in path:
            value = value.get(step) if isinstance(value, dict) else None
        number = parse_num(value)
        if number is not None:
            flat[key] = number
    return flat


def _prefer_full_response(metrics: dict[str, float]) -> dict[str, float]:
    if not any(f"{stat}_full_response_itl" in metrics for stat in FULL_RESPONSE_STATS):
        return metrics
    out = {key: value for key, value in metrics.items()
           if not re.fullmatch(r"(mean|median|p75|p90|p95|p99|p99\.9|std)_(itl|intvty)", key)}
    for stat in FULL_RESPONSE_STATS:
        itl = out.get(f"{stat}_full_response_itl")
        if itl is not None and math.isfinite(itl) and itl > 0:
            out[f"{stat}_itl"], out[f"{stat}_intvty"] = itl, 1 / itl
    return out


def _model_key(row: dict[str, Any]) -> str | None:
    prefix = row.get("infmax_model_prefix") or row.get("model_prefix")
    if prefix:
        lower = str(prefix).lower()
        if lower in MODEL_KEYS:
            return lower
        if lower in PREFIX_ALIASES:
            return PREFIX_ALIASES[lower]
        stripped = PRECISION_SUFFIX.sub("", lower)
        if stripped in MODEL_KEYS:
            return stripped
        if stripped in PREFIX_ALIASES:
            return PREFIX_ALIASES[stripped]
    return None  # MODEL_TO_KEY's model paths: none of our rows' models is one


def _int(value: Any) -> int | None:
    """normalizers.ts parseInt2: a string's leading integer, a number rounded."""
    if value is None:
        return None
    if isinstance(value, str):
        match = re.match(r"\s*[-+]?\d+", value)
        return int(match.group(0)) if match else None
    number = parse_num(value)
    return None if number is None else int(math.floor(number + 0.5))


def _percentile(values: list[float], p: float) -> float:
    """aggregation_common.py: linear between the two nearest ranks of the sorted values."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    low = int(k)
    return ordered[low] if low + 1 >= len(ordered) else ordered[low] + (k - low) * (ordered[low + 1] - ordered[low])


def _stats_for(name: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    out = {f"mean_{name}": statistics.mean(values),
           f"std_{name}": statistics.pstdev(values) if len(values) > 1 else 0.0}
    out.update({f"{'median' if key == 'p50' else key}_{name}": _percentile(values, p)
                for key, p in PERCENTILES.items()})
    return out


def _qps(ends: list[float]) -> dict[str, float]:
    """request_metrics.py compute_qps_stats: completions per 1 s window from the first completion on."""
    if len(ends) < 2 or ends[-1] - ends[0] <= 0:
        return {}
    counts, current = [], ends[0]
    while current + 1.0 <= ends[-1]:
        counts.append(float(sum(1 for end in ends if current <= end < current + 1.0)))
        current += 1.0
    return _stats_for("qps", counts) if counts else {"mean_qps": len(ends) / (ends[-1] - ends[0])}
