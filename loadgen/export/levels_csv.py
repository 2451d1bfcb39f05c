"""CSV export of results files: one row per level per file.

Columns: run, file, level index and label, mode, concurrency, rate, failed, window, counts,
every throughput figure, the Pareto marks (on_frontier_interactivity / _e2el / _e2e_interactivity,
over all levels of all files given), then `<metric>_<stat>` for every metric and statistic in
the metric's stored unit, named in the column (`ttft_p90_us`, `interactivity_p50_tok_s`, ...).
Percentiles here are ours (HDR histograms, interactivity's pX = 1 / pX(TPOT)); the InferenceX
shapes, with InferenceX's own statistics, are loadgen/export/infx.py.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadgen.report.runs import Run, frontier_keys
from loadgen.results.metric_registry import METRICS as METRIC_DEFINITIONS
from loadgen.results.metrics import PERCENTILES
from loadgen.results.pareto import NORMALIZED

STATS = ("count", "mean", "std", "min", *(f"p{p:g}" for p in PERCENTILES), "max")


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
            for metric in METRIC_DEFINITIONS:
                entry = level["metrics"][metric.name]
                unit = entry["unit"].replace("/", "_")
                for stat in STATS:
                    suffix = "" if stat == "count" else f"_{unit}"
                    row[f"{metric.name}_{stat}{suffix}"] = entry["stats"].get(stat)
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

