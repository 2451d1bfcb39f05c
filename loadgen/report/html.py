"""A self-contained HTML report of one or more results files: one file, no external references.

Holds the runs (status, model, command), the sweep summary with Pareto marks and the review's Pareto
evidence per curve (loadgen/recipe/evidence.py), every plot of
loadgen/report/plots.py as an embedded PNG (data:image/png;base64 URI), each level's statistics table
(the rows of loadgen/report/table.py), its SLO attainment, its latencies by context and by turn with
the sessions line (loadgen/results/turns.py), where the level has them, each level's timeline (swim lanes
of its session plays over the server's series, loadgen/report/timeline.py: inlined scripts that draw
when the page opens), and the metric definitions. All text from the results files is HTML-escaped
or embedded as escaped JSON.
"""

from __future__ import annotations

import base64
import tempfile
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from loadgen.report import timeline
from loadgen.report.runs import Run
from loadgen.report.table import (
    BREAKDOWN,
    COLUMNS,
    ROWS,
    attainment_text,
    goodput_text,
    sessions_text,
    shown,
    slo_bounds,
    slo_verdict,
    worst_text,
)
from loadgen.report.terminal import EVIDENCE_TITLE, SUMMARY_COLUMNS, evidence_text, format_cell, summary_rows

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f2f2f2; }
img { max-width: 100%; margin: 0.5em 0 1.5em; border: 1px solid #eee; }
.failed { color: #b00; font-weight: bold; }
code { background: #f5f5f5; padding: 0 0.2em; }
"""

DEFINITIONS = (
    ("TTFT", "request sent (intended send time in open loop) to first content token"),
    ("TPOT", "per request (E2EL - TTFT) / (OSL - 1)"),
    ("interactivity", "per request 1 / TPOT, tokens/s/user; pX interactivity = 1 / pX(TPOT), the slow tail"),
    ("E2EL", "request sent to last token"),
    ("E2EL / OSL", "normalized E2EL; e2e interactivity = 1 / p90(E2EL / OSL)"),
    ("throughput per GPU", "tokens counted in the measurement window / window seconds / GPUs"),
    ("frontier", "I: throughput/GPU vs p50 interactivity, E: vs p90 E2EL, N: vs e2e interactivity; "
                 "a level shows on I or E only if it is on N (InferenceX's rule)"),
    ("SLO", "bounds on a request's latencies (e.g. ttft<=5s, interactivity>=20); a request is good when it "
            "completed and met every bound, a failed request never is"),
    ("attainment", "the share of a level's requests that were good, and of its session plays whose every "
                   "request was, with a 95 % interval; the target is met when the interval's lower end reaches "
                   "it, not met when its upper end is below it, undecided otherwise"),
    ("goodput", "good requests, and their output tokens, per second of the measurement window (tokens also "
                "per GPU)"),
    ("turn", "a request's index among its session's parent requests (a subagent's requests count within the "
             "subagent); the by-turn rows hold parent requests only, in buckets 0-1, 2-3, 4-7, ... 128+"),
    ("context bucket", "requests (parents and subagents) grouped by their input tokens, the context they were "
                       "sent with, in doubling buckets (<1k, 1k-2k, ... >=256k; 1k = 1024 tokens); "
                       "percentiles there are nearest-rank over the bucket's requests"),
)


def write_html(runs: Sequence[Run], path: Path, plots: Sequence[tuple[Path, str]] | None = None,
               sections: Sequence[tuple[str, str]] = (), evidence: str | None = None) -> Path:
    """Embed the plots (the (png, title) pairs `plots.render_plots` wrote; rendered into a scratch
    folder when not given), write one HTML file; `sections` are extra (title, text) blocks at the end;
    `evidence` the runs' Pareto evidence text, when the caller has it already."""
    if plots is None:
        from loadgen.report.plots import render_plots

        with tempfile.TemporaryDirectory(prefix="agentload-plots-") as scratch:
            images = [(title, png.read_bytes()) for png, title in render_plots(runs, Path(scratch))]
    else:
        images = [(title, png.read_bytes()) for png, title in plots]
    path.write_text(render_html(runs, images, sections, evidence), encoding="utf-8")
    return path


def _capacity_section(runs: Sequence[Run]) -> list[str]:
    """The capacity searches' answers (loadgen capacity), one line per run that has one."""
    searched = [run for run in runs if run.doc.get("capacity")]
    if not searched:
        return []
    from loadgen.capacity.describe import describe_capacity

    items = "".join(f"<li>{escape(run.name)}: {escape(describe_capacity(run.doc['capacity']))}</li>"
                    for run in searched)
    return ["<h2>Capacity</h2>", f"<ul>{items}</ul>"]


def write_report_folder(out: Path, quiet: bool) -> None:
    """PNG plots and the HTML report of the results file in `out` into `out`/report/ (what
    `loadgen report --format png,html` writes); nothing when no level was measured."""
    from loadgen.report.plots import render_plots
    from loadgen.report.runs import load_runs, resolve

    path = resolve(out)
    if not path.exists():
        return
    runs = load_runs([path])
    if not runs[0].doc["levels"]:
        return
    folder = out / "report"
    folder.mkdir(parents=True, exist_ok=True)
    plots = render_plots(runs, folder)
    written = [png for png, _ in plots] + [write_html(runs, folder / "report.html", plots)]
    if not quiet:
        for file in written:
            print(f"wrote {file}")


def render_html(runs: Sequence[Run], images: Sequence[tuple[str, bytes]],
                sections: Sequence[tuple[str, str]] = (), evidence: str | None = None) -> str:
    if evidence is None:
        evidence = evidence_text(runs)
    timelines = any(timeline.has_timeline(level) for run in runs for level in run.doc["levels"])
    style = STYLE + timeline.head_style() if timelines else STYLE
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>agentload report</title>", f"<style>{style}</style></head><body>",
             "<h1>agentload report</h1>", _runs_table(runs), *_capacity_section(runs), "<h2>Sweep summary</h2>",
             _summary_table(summary_rows(runs)), f"<h2>{EVIDENCE_TITLE}</h2><pre>{escape(evidence)}</pre>",
             "<h2>Plots</h2>"]
    for title, png in images:
        data = base64.b64encode(png).decode("ascii")
        parts.append(f'<h3>{escape(title)}</h3><img alt="{escape(title)}" src="data:image/png;base64,{data}">')
    for r, run in enumerate(runs):
        parts.append(f"<h2>Levels of {escape(run.name)}</h2>")
        parts += ([_level_section(level, f"timeline-{r}-{i}") for i, level in enumerate(run.doc["levels"])]
                  or ["<p>No levels measured.</p>"])
    parts += [f"<h2>{escape(title)}</h2><pre>{escape(text)}</pre>" for title, text in sections]
    parts.append("<h2>Definitions</h2><ul>")
    parts += [f"<li><b>{escape(name)}</b>: {escape(text)}</li>" for name, text in DEFINITIONS]
    parts.append("</ul>")
    if timelines:  # last: the levels' elements and data are in the page when the scripts run
        parts.append(timeline.scripts())
    parts.append("</body></html>")
    return "\n".join(parts)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _runs_table(runs: Sequence[Run]) -> str:
    rows = []
    for run in runs:
        doc, config = run.doc, run.doc["config"]
        rows.append([run.name, str(run.path), doc["status"] + (f": {doc['message']}" if doc.get("message") else ""),
                     str(doc.get("created", "-")), str(config.get("model", "-")), str(config.get("gpus", "-")),
                     " ".join(config.get("command_line") or []) or "-"])
    return _table(("run", "file", "status", "created", "model", "GPUs", "command"), rows)


def _summary_table(rows: Sequence[dict[str, Any]]) -> str:
    header = [f"{head} ({unit})" if unit else head for _, head, unit in SUMMARY_COLUMNS]
    return _table(header, [[format_cell(row[key]) for key, _, _ in SUMMARY_COLUMNS] for row in rows])


def _level_section(level: dict[str, Any], key: str) -> str:
    counts, tput = level["counts"], level["throughput"]
    label = escape(level.get("label") or "level")
    lines = [f"<h3>{label}</h3>",
             f"<p>window {level['window_s']:.1f} s, {counts['requests_ok']} requests ok, "
             f"error rate {counts['error_rate']:.1%}; output {tput['output_tokens_per_s']:.1f} tok/s "
             f"({tput['output_tokens_per_s_per_gpu']:.1f} per GPU, {tput['gpus']} GPU), "
             f"{tput['requests_per_s']:.2f} req/s</p>"]
    if level["failed"]:
        lines.append(f'<p class="failed">FAILED: {escape("; ".join(level["fail_reasons"]))}</p>')
    for warning in (level.get("client") or {}).get("warnings", []):
        lines.append(f'<p class="failed">WARNING: {escape(warning)}</p>')
    rows = []
    for metric in ROWS:
        stats = level["metrics"][metric.name]["stats"]
        if stats["count"]:
            rows.append([metric.label, metric.shown_unit, *(format_cell(shown(metric, stats[c])) for c in COLUMNS)])
    lines.append(_table(("metric", "unit", *COLUMNS), rows))
    if level.get("slo"):  # absent in results of earlier versions, as is `turns`
        lines.append(_slo_table(level["slo"]))
    if turns := level.get("turns"):
        lines.append(_breakdown_table("by context", "context (tokens)", turns["by_context"]))
        if turns["by_turn"] is not None:
            lines.append(_breakdown_table("by turn (parent requests)", "turns", turns["by_turn"]))
        lines.append(f"<p>{escape(sessions_text(turns['sessions']))}</p>")
    lines.append(timeline.level_timeline(level, key))
    return "\n".join(lines)


def _slo_table(entries: Sequence[dict[str, Any]]) -> str:
    rows = [[entry["name"], slo_bounds(entry), f"{attainment_text(entry['requests'])} ({slo_verdict(entry)})",
             attainment_text(entry["sessions"]), goodput_text(entry["goodput"]), worst_text(entry)]
            for entry in entries]
    return "<h4>SLO</h4>" + _table(("SLO", "spec", "requests good", "sessions good", "goodput", "most violated"), rows)


def _breakdown_table(title: str, bucket: str, rows: Sequence[dict[str, Any]]) -> str:
    """Latency percentiles per bucket (loadgen/results/turns.py), with the mean context and the good share."""
    header = (bucket, "requests", "mean context (tokens)", *(f"{label} ({unit})" for label, unit, _, _ in BREAKDOWN),
              "good share")
    cells = [[row["label"], str(row["requests"]), format_cell(row["isl_mean"]),
              *(format_cell(row[key][stat]) for _, _, key, stat in BREAKDOWN),
              "-" if row["good_share"] is None else f"{row['good_share']:.1%}"] for row in rows]
    return f"<h4>{escape(title)}</h4>" + _table(header, cells)
