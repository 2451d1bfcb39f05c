"""Flat exports of results files: CSV (one row per level per file) and InferenceX aggregates.

CSV columns: run, file, level index and label, mode, concurrency, rate, failed, window, counts,
every throughput figure, the Pareto marks (on_frontier_interactivity / _e2el / _e2e_interactivity,
over all levels of all files given), then `<metric>_<stat>` for every metric and statistic in
the metric's stored unit, named in the column (`ttft_p90_us`, `interactivity_p50_tok_s`, ...).

InferenceX aggregates (`--format infx`, one JSON object per level per file) use InferenceX's key
names and units: latencies in SECONDS, throughput in TOKENS/S. Each `<stat>_<metric>` key has
stat in mean, median (= p50), std, p90, p95, p99, p99.9 and metric in:

- ttft: request sent -> first content token, s.
- tpot: per request (E2EL - TTFT) / (OSL - 1), s.
- itl: gap between consecutive content chunks, s (ours is per chunk: with speculative decoding a
  chunk can carry several tokens; vLLM's ITL divides such gaps per token).
- e2el: request sent -> last token, s.
- intvty: interactivity, tokens/s/user = 1 / <stat>_tpot, exactly as InferenceX derives it from
  the TPOT statistic (so mean_intvty = 1 / mean TPOT and p90_intvty = 1 / p90 TPOT, the slow
  tail); there is no std_intvty (1 / std is not a spread).

and throughput per GPU (GPUs = the run's `gpus`; we serve aggregated, so prefill and decode GPUs
are the same ones):

- tput_per_gpu: (input + output) tokens / window seconds / GPUs.
- output_tput_per_gpu: output tokens / window seconds / GPUs.
- input_tput_per_gpu: input tokens / window seconds / GPUs.

Beside them: conc, model, tp (= GPUs), num_requests_successful, and ours: label, run, failed,
and e2e_intvty = 1 / p90(E2EL / OSL), tokens/s/user.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from loadgen.metrics import METRIC_SPECS, PERCENTILES
from loadgen.pareto import NORMALIZED, e2e_interactivity
from loadgen.report import Run, frontier_keys

STATS = ("count", "mean", "std", "min", *(f"p{p:g}" for p in PERCENTILES), "max")
INFX_STATS = (("mean", "mean"), ("median", "p50"), ("std", "std"),
              *((f"p{p:g}", f"p{p:g}") for p in PERCENTILES if p != 50))
INFX_LATENCIES = ("ttft", "tpot", "itl", "e2el")


def csv_rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
    keys = frontier_keys(runs)
    rows = []
    for run in runs:
        for index, level in enumerate(run.doc["levels"]):
            counts, tput = level["counts"], level["throughput"]
            row: dict[str, Any] = {
                "run": run.name, "file": str(run.path), "level": index, "label": level.get("label"),
                "mode": level["mode"], "concurrency": level["concurrency"], "rate": level["rate"],
                "failed": level["failed"], "window_s": level["window_s"],
                "requests_ok": counts["requests_ok"], "errors_total": counts["errors_total"],
                "error_rate": counts["error_rate"], "input_tokens": counts["input_tokens"],
                "output_tokens": counts["output_tokens"], **tput,
            }
            for axis in ("interactivity", "e2el", NORMALIZED):
                row[f"on_frontier_{axis}"] = (run.name, index) in keys[axis]
            for spec in METRIC_SPECS:
                entry = level["metrics"][spec.name]
                unit = entry["unit"].replace("/", "_")
                for stat in STATS:
                    suffix = "" if stat == "count" else f"_{unit}"
                    row[f"{spec.name}_{stat}{suffix}"] = entry["stats"].get(stat)
            rows.append(row)
    return rows


def write_csv(runs: Sequence[Run], path: Path) -> Path:
    rows = csv_rows(runs)
    fields = list(dict.fromkeys(key for row in rows for key in row)) or ["run"]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def infx_entry(run: Run, level: dict[str, Any]) -> dict[str, Any]:
    """InferenceX's aggregate keys for one level (see the module docstring for definitions)."""
    config, counts, tput = run.doc["config"], level["counts"], level["throughput"]
    gpus = max(1, int(tput.get("gpus") or 1))
    window = level["window_s"]
    per_gpu = (lambda tokens: tokens / window / gpus) if window > 0 else (lambda tokens: 0.0)
    entry: dict[str, Any] = {
        "conc": level["concurrency"], "model": config.get("model"), "tp": gpus,
        "num_requests_successful": counts["requests_ok"], "label": level.get("label"), "run": run.name,
        "failed": level["failed"],
        "tput_per_gpu": per_gpu(counts["input_tokens"] + counts["output_tokens"]),
        "output_tput_per_gpu": per_gpu(counts["output_tokens"]),
        "input_tput_per_gpu": per_gpu(counts["input_tokens"]),
    }
    for metric in INFX_LATENCIES:
        stats = level["metrics"][metric]["stats"]
        for key, stat in INFX_STATS:
            entry[f"{key}_{metric}"] = _seconds(stats.get(stat))
    tpot = level["metrics"]["tpot"]["stats"]
    for key, stat in INFX_STATS:
        if key != "std":
            value = tpot.get(stat)
            entry[f"{key}_intvty"] = 1e6 / value if value else None
    entry["e2e_intvty"] = e2e_interactivity(level)
    return entry


def infx_entries(runs: Sequence[Run]) -> list[dict[str, Any]]:
    return [infx_entry(run, level) for run in runs for level in run.doc["levels"]]


def write_infx(runs: Sequence[Run], path: Path) -> Path:
    path.write_bytes(orjson.dumps(infx_entries(runs), option=orjson.OPT_INDENT_2))
    return path


def _seconds(microseconds: float | int | None) -> float | None:
    return None if microseconds is None else microseconds / 1e6
