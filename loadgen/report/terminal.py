"""The terminal report of one or more results files (loadgen/report/runs.py reads them).

The report is, per file, a header (model, status, command) and each level's detail table
(loadgen/report/table.py, the same table `loadgen replay` prints), then one sweep summary over all
levels of all files with the Pareto frontiers marked (loadgen/results/pareto.py), and the review's
Pareto evidence per curve (loadgen/recipe/evidence.py). `summary_rows` is shared by the terminal,
CSV and HTML outputs so they all show the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadgen.report.runs import Run, frontier_keys
from loadgen.report.table import format_level
from loadgen.results.metric_registry import STATISTIC_BY_NAME, stored_value
from loadgen.results.pareto import NORMALIZED

FRONTIER_MARKS = (("interactivity", "I"), ("e2el", "E"), (NORMALIZED, "N"))


# (row key, statistic) of the sweep summary's headline columns, each in its registry unit
HEADLINES = (
    ("output_tput_per_gpu", "output_tput_per_gpu"), ("total_tput_per_gpu", "total_tput_per_gpu"),
    ("ttft_p50_ms", "ttft_p50"), ("ttft_p90_ms", "ttft_p90"), ("tpot_p50_ms", "tpot_p50"),
    ("interactivity_p50", "interactivity_p50"), ("interactivity_p90", "interactivity_p90"),
    ("e2el_p50_s", "e2el_p50"), ("e2el_p90_s", "e2el_p90"), ("e2e_interactivity", "e2e_interactivity"),
)
# (key, header, unit) of the sweep summary; values in the shown unit
SUMMARY_COLUMNS = (
    ("run", "run", ""), ("level", "level", ""),
    ("requests_ok", "requests", ""), ("error_rate_pct", "errors", "%"),
    *((key, STATISTIC_BY_NAME[name].header, STATISTIC_BY_NAME[name].unit) for key, name in HEADLINES),
    ("frontier", "frontier", ""),
)


def summary_rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """One row per level per run (SUMMARY_COLUMNS keys); `frontier` marks I/E/N, or FAILED."""
    keys = frontier_keys(runs)
    rows = []
    for run in runs:
        for index, level in enumerate(run.doc["levels"]):
            marks = "".join(mark for axis, mark in FRONTIER_MARKS if (run.name, index) in keys[axis])
            rows.append({
                "run": run.name, "level": level.get("label") or f"level {index}",
                "requests_ok": level["counts"]["requests_ok"],
                "error_rate_pct": 100.0 * level["counts"]["error_rate"],
                **{key: stored_value(level, STATISTIC_BY_NAME[name]) for key, name in HEADLINES},
                "frontier": "FAILED" if level["failed"] else marks,
            })
    return rows


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
    parts += ["", f"== {EVIDENCE_TITLE}", evidence_text(runs)]
    return "\n".join(parts)


EVIDENCE_TITLE = "Pareto evidence per curve"


def evidence_text(runs: Sequence[Run]) -> str:
    """The review's Pareto evidence per curve (points measured, invalid, on the frontier; a warning under
    the recommended valid points), a curve being one recipe fingerprint or else one file."""
    from loadgen.recipe.evidence import curve_evidence, describe_evidence

    return describe_evidence(curve_evidence([(run.path, run.doc) for run in runs]))
