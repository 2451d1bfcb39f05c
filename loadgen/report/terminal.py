"""The terminal report of one or more results files (loadgen/report/runs.py reads them).

The report is, per file, a header (model, status, command) and each level's detail table
(loadgen/report/table.py, the same table `loadgen replay` prints), then one sweep summary over all
levels of all files with the Pareto frontiers marked (loadgen/results/pareto.py). `summary_rows` is
shared by the terminal, CSV and HTML outputs so they all show the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadgen.report.runs import Run, frontier_keys
from loadgen.report.table import format_level
from loadgen.results.pareto import NORMALIZED, e2e_interactivity

FRONTIER_MARKS = (("interactivity", "I"), ("e2el", "E"), (NORMALIZED, "N"))


# (key, header, unit) of the sweep summary; values in the shown unit
SUMMARY_COLUMNS = (
    ("run", "run", ""), ("level", "level", ""),
    ("requests_ok", "requests", ""), ("error_rate_pct", "errors", "%"),
    ("output_tput_per_gpu", "out tok/s/GPU", "tok/s"), ("total_tput_per_gpu", "total tok/s/GPU", "tok/s"),
    ("ttft_p50_ms", "TTFT p50", "ms"), ("ttft_p90_ms", "TTFT p90", "ms"),
    ("tpot_p50_ms", "TPOT p50", "ms"),
    ("interactivity_p50", "intvty p50", "tok/s"), ("interactivity_p90", "slow-tail intvty p90", "tok/s"),
    ("e2el_p50_s", "E2EL p50", "s"), ("e2el_p90_s", "E2EL p90", "s"),
    ("e2e_interactivity", "e2e intvty", "tok/s"), ("frontier", "frontier", ""),
)


def summary_rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """One row per level per run (SUMMARY_COLUMNS keys); `frontier` marks I/E/N, or FAILED."""
    keys = frontier_keys(runs)
    rows = []
    for run in runs:
        for index, level in enumerate(run.doc["levels"]):
            stats = {name: level["metrics"][name]["stats"] for name in ("ttft", "tpot", "interactivity", "e2el")}
            tput = level["throughput"]
            marks = "".join(mark for axis, mark in FRONTIER_MARKS if (run.name, index) in keys[axis])
            rows.append({
                "run": run.name, "level": level.get("label") or f"level {index}",
                "requests_ok": level["counts"]["requests_ok"],
                "error_rate_pct": 100.0 * level["counts"]["error_rate"],
                "output_tput_per_gpu": tput["output_tokens_per_s_per_gpu"],
                "total_tput_per_gpu": tput["total_tokens_per_s_per_gpu"],
                "ttft_p50_ms": _scaled(stats["ttft"]["p50"], 1e-3), "ttft_p90_ms": _scaled(stats["ttft"]["p90"], 1e-3),
                "tpot_p50_ms": _scaled(stats["tpot"]["p50"], 1e-3),
                "interactivity_p50": stats["interactivity"]["p50"], "interactivity_p90": stats["interactivity"]["p90"],
                "e2el_p50_s": _scaled(stats["e2el"]["p50"], 1e-6), "e2el_p90_s": _scaled(stats["e2el"]["p90"], 1e-6),
                "e2e_interactivity": e2e_interactivity(level),
                "frontier": "FAILED" if level["failed"] else marks,
            })
    return rows


def _scaled(value: float | int | None, factor: float) -> float | None:
    return None if value is None else value * factor


def format_summary(rows: Sequence[dict[str, Any]]) -> str:
    """The sweep summary as aligned text columns."""
    heads = [f"{head} ({unit})" if unit else head for _, head, unit in SUMMARY_COLUMNS]
    cells = [[format_cell(row[key]) for key, _, _ in SUMMARY_COLUMNS] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(heads)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def format_cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def describe_run(run: Run) -> str:
    doc, config = run.doc, run.doc["config"]
    command = " ".join(config.get("command_line") or []) or "-"
    return (f"# {run.name} ({run.path}): {doc['status']}, created {doc.get('created', '-')}, model "
            f"{config.get('model', '-')}, {config.get('gpus', '-')} GPU\n#   command: {command}"
            + (f"\n#   message: {doc['message']}" if doc.get("message") else ""))


def format_report(runs: Sequence[Run]) -> str:
    parts = []
    for run in runs:
        parts.append(describe_run(run))
        parts += [format_level(level) for level in run.doc["levels"]]
        if not run.doc["levels"]:
            parts.append("   (no levels measured)")
    parts.append("")
    parts.append("== sweep summary: frontier I = throughput/GPU vs p50 interactivity, E = vs p90 E2EL, "
                 "N = vs e2e interactivity 1 / p90(E2EL/OSL); a level shows on I or E only if it is on N")
    parts.append(format_summary(summary_rows(runs)))
    return "\n".join(parts)
