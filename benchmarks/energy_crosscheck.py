"""A run's GPU energy as loadgen measured it (its `gpu` block per level) against nvidia-smi's power
samples integrated over the same windows.

Start nvidia-smi beside the run, then give this script the result and the samples:

    nvidia-smi --query-gpu=timestamp,index,power.draw,power.draw.instant --format=csv,noheader,nounits \\
        -lms 100 > smi.csv &
    loadgen replay ... --gpu-telemetry nvml --out run
    python benchmarks/energy_crosscheck.py run/result.json smi.csv --json check.json

Each level's window is placed on the wall clock by its `window_start_unix`; nvidia-smi's timestamps
are local time of the host that wrote them, so run this on that host. The samples are integrated by
trapezoid, each power column on its own; the window's ends are interpolated between samples. This
driver's nvidia-smi has no energy counter of its own (`nvidia-smi -q -d POWER` lists power draws
only), so its integrated power is the independent reading.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from datetime import datetime
from pathlib import Path

import numpy as np

from loadgen.results.file import read_results

COLUMNS = ("timestamp", "index", "power.draw", "power.draw.instant")


def read_samples(path: Path) -> dict[int, dict[str, np.ndarray]]:
    """GPU index -> {"t": Unix seconds, column: watts}; rows nvidia-smi could not read ([N/A]) are skipped."""
    rows: dict[int, list[tuple[float, ...]]] = {}
    with path.open(newline="") as f:
        for number, row in enumerate(csv.reader(f), 1):
            if len(row) != len(COLUMNS):
                raise SystemExit(f"{path}:{number}: expected {len(COLUMNS)} columns ({', '.join(COLUMNS)}), "
                                 f"got {len(row)}")
            try:
                t = datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
                rows.setdefault(int(row[1]), []).append((t, float(row[2]), float(row[3])))
            except ValueError:
                continue
    if not rows:
        raise SystemExit(f"{path}: no readable samples")
    out = {}
    for gpu, values in rows.items():
        a = np.array(sorted(values), dtype=np.float64)
        out[gpu] = {"t": a[:, 0], COLUMNS[2]: a[:, 1], COLUMNS[3]: a[:, 2]}
    return out


def integrate(t: np.ndarray, watts: np.ndarray, start: float, end: float) -> float | None:
    """Joules between `start` and `end` (trapezoid, ends interpolated); None when the samples do not cover them."""
    if t[0] > start or t[-1] < end:
        return None
    cumulative = np.concatenate(([0.0], np.cumsum((watts[1:] + watts[:-1]) / 2 * np.diff(t))))
    at_start, at_end = np.interp([start, end], t, cumulative)
    return float(at_end - at_start)


def crosscheck(result: dict, samples: dict[int, dict[str, np.ndarray]]) -> list[dict]:
    """One row per level and GPU: loadgen's energy against nvidia-smi's integrated power columns."""
    rows = []
    for level in result["levels"]:
        start, window_s, gpu = level.get("window_start_unix"), level["window_s"], level.get("gpu") or {}
        if start is None:
            raise SystemExit(f"level {level['label']}: no window_start_unix (a result written before it was added)")
        for entry in gpu.get("gpus", []):
            series = samples.get(entry["index"])
            row = {"level": level["label"], "gpu": entry["index"], "window_s": window_s,
                   "loadgen_j": entry["energy_j"], "loadgen_from": entry["energy_from"], "source": gpu.get("source")}
            for column in COLUMNS[2:]:
                joules = None if series is None else integrate(series["t"], series[column], start, start + window_s)
                row[f"smi_{column}_j"] = joules
                row[f"smi_{column}_diff"] = (None if joules is None or not entry["energy_j"]
                                             else joules / entry["energy_j"] - 1)
            row["smi_samples"] = 0 if series is None else int(((series["t"] >= start)
                                                               & (series["t"] <= start + window_s)).sum())
            rows.append(row)
    return rows


def smi_reading(row: dict, column: str) -> str:
    """One nvidia-smi column's energy over the window, and its difference from loadgen's where that has one."""
    joules, diff = row[f"smi_{column}_j"], row[f"smi_{column}_diff"]
    if joules is None:
        return f"{column}: samples do not cover the window"
    return f"{column} {joules:.1f} J" + (f" ({diff:+.2%})" if diff is not None else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("result", type=Path, help="a run's result.json")
    p.add_argument("samples", type=Path, help="nvidia-smi's CSV: " + ",".join(COLUMNS) + ", noheader, nounits")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    rows = crosscheck(read_results(args.result), read_samples(args.samples))
    if not rows:
        sys.exit(f"{args.result}: no level has a GPU energy reading to check")
    for row in rows:
        smi = ", ".join(smi_reading(row, column) for column in COLUMNS[2:])
        print(f"{row['level']} GPU {row['gpu']}: loadgen {row['loadgen_j']:.1f} J ({row['loadgen_from']}) over "
              f"{row['window_s']:.1f} s; nvidia-smi ({row['smi_samples']} samples) {smi}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
