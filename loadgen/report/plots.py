"""PNG plots of one or more results files (matplotlib, Agg backend, imported only when called).

- tput_vs_interactivity.png: output tokens/s per GPU against p50 interactivity (tok/s/user);
- tput_vs_e2el.png: the same against p90 E2EL (s);
- tput_vs_e2e_interactivity.png: the same against 1 / p90(E2EL/OSL) (tok/s/user);
- ttft_percentiles.png, e2el_percentiles.png: p50 / p90 / p99 per level;
- ttft_vs_context.png: TTFT p50 and p90 against the context (input tokens) the requests were sent
  with, one pair of lines per level: the "agentic curve", from each level's `turns.by_context`
  rows (loadgen/results/turns.py); only when some non-failed level has them.

Scatter plots show one point per non-failed level, labelled with its concurrency (or rate),
one colour per results file, and the Pareto frontier over all files (loadgen/results/pareto.py, with
the normalized-frontier rule) as a dashed line through circled points. Percentile plots leave
failed levels out and circle the p50 of the levels on the e2e-normalized frontier.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadgen.report.runs import Run, run_points
from loadgen.results.metric_registry import METRIC_BY_NAME, STATISTIC_BY_NAME
from loadgen.results.pareto import AXES, NORMALIZED, Point, frontiers

SCATTERS = (
    ("tput_vs_interactivity.png", "interactivity", "p50 interactivity (tok/s/user)"),
    ("tput_vs_e2el.png", "e2el", "p90 end-to-end latency (s)"),
    ("tput_vs_e2e_interactivity.png", NORMALIZED, "e2e interactivity 1 / p90(E2EL/OSL) (tok/s/user)"),
)
# (file, metric): p50 / p90 / p99 of the metric, in its percentiles' unit (the registry's `<metric>_p50`)
PERCENTILE_PLOTS = (("ttft_percentiles.png", "ttft"), ("e2el_percentiles.png", "e2el"))
PERCENTILE_STYLES = (("p50", "-"), ("p90", "--"), ("p99", ":"))
CONTEXT_PLOT = "ttft_vs_context.png"
CAPACITY_PLOT = "capacity.png"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def render_plots(runs: Sequence[Run], out: Path) -> list[tuple[Path, str]]:
    """Write the plots; returns (path, title) pairs, for the HTML report too."""
    plt = _pyplot()
    points = run_points(runs)
    chosen = frontiers(points)
    written = []
    for name, axis, xlabel in SCATTERS:
        fig = _scatter(plt, runs, points, chosen[axis], axis, xlabel)
        written.append((_save(plt, fig, out / name), fig.axes[0].get_title()))
    normalized = {(p.source, p.level) for p in chosen[NORMALIZED]}
    for name, metric in PERCENTILE_PLOTS:
        unit = STATISTIC_BY_NAME[f"{metric}_p50"]
        ylabel = f"{METRIC_BY_NAME[metric].label} ({unit.unit})"
        fig = _percentiles(plt, runs, metric, ylabel, unit.scale, normalized)
        written.append((_save(plt, fig, out / name), fig.axes[0].get_title()))
    curves = _context_curves(runs)
    if curves:
        fig = _ttft_vs_context(plt, curves)
        written.append((_save(plt, fig, out / CONTEXT_PLOT), fig.axes[0].get_title()))
    searched = [run for run in runs if run.doc.get("capacity")]
    if searched:
        fig = _capacity(plt, searched)
        written.append((_save(plt, fig, out / CAPACITY_PLOT), fig.axes[0].get_title()))
    return written


def _save(plt, fig, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _scatter(plt, runs: Sequence[Run], points: list[Point], frontier: list[Point], axis: str, xlabel: str):
    attr, _ = AXES[axis]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for number, run in enumerate(runs):
        mine = [p for p in points if p.source == run.name and getattr(p, attr) is not None]
        xs = [getattr(p, attr) for p in mine]
        ax.scatter(xs, [p.tput_per_gpu for p in mine], color=f"C{number}", label=run.name, zorder=3)
        for p, x in zip(mine, xs):
            ax.annotate(_short(p.label), (x, p.tput_per_gpu), textcoords="offset points", xytext=(5, 4), fontsize=8)
    line = sorted((getattr(p, attr), p.tput_per_gpu) for p in frontier)
    if line:
        ax.plot([x for x, _ in line], [y for _, y in line], "k--", linewidth=1, label="Pareto frontier", zorder=2)
        ax.scatter([x for x, _ in line], [y for _, y in line], s=140, facecolors="none", edgecolors="k", zorder=4)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("output throughput per GPU (tok/s)")
    ax.set_title(f"Throughput per GPU vs {xlabel.split(' (')[0]}")
    ax.grid(True, alpha=0.3)
    if not points:
        ax.text(0.5, 0.5, "no successful levels", ha="center", va="center", transform=ax.transAxes)
    ax.legend(fontsize=8)
    return fig


def _percentiles(plt, runs: Sequence[Run], metric: str, ylabel: str, scale: float,
                 frontier: set[tuple[str, int]]):
    labels = list(dict.fromkeys(level.get("label") or f"level {i}" for run in runs
                                for i, level in enumerate(run.doc["levels"])))
    fig, ax = plt.subplots(figsize=(7.5, 5))
    legend: str | None = "on the e2e Pareto frontier"
    for number, run in enumerate(runs):
        by_label = {level.get("label") or f"level {i}": (i, level) for i, level in enumerate(run.doc["levels"])}
        for stat, style in PERCENTILE_STYLES:
            xs, ys, marked = [], [], []
            for x, label in enumerate(labels):
                index, level = by_label.get(label, (None, None))
                value = _stat(level, metric, stat)
                if value is not None:
                    xs.append(x)
                    ys.append(value * scale)
                    if stat == "p50" and (run.name, index) in frontier:
                        marked.append((x, value * scale))
            ax.plot(xs, ys, style, marker="o", color=f"C{number}", label=f"{run.name} {stat}")
            if marked:
                ax.scatter(*zip(*marked), s=140, facecolors="none", edgecolors="k", zorder=4, label=legend)
                legend = None
    ax.set_xticks(range(len(labels)), [_short(label) for label in labels])
    ax.set_xlabel("level")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{ylabel.split(' (')[0]} percentiles per level")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _context_curves(runs: Sequence[Run]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(line label, by-context rows) of every non-failed level that has them; the run's name leads
    the label when there are several runs."""
    curves = []
    for run in runs:
        for index, level in enumerate(run.doc["levels"]):
            rows = (level.get("turns") or {}).get("by_context")  # absent in results of earlier versions
            if rows and not level["failed"]:
                label = level.get("label") or f"level {index}"
                curves.append((f"{run.name} {label}" if len(runs) > 1 else label, rows))
    return curves


def _ttft_vs_context(plt, curves: Sequence[tuple[str, list[dict[str, Any]]]]):
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for number, (label, rows) in enumerate(curves):
        xs = [_midpoint(row["context"]) for row in rows]
        for stat, style in PERCENTILE_STYLES[:2]:
            ax.plot(xs, [row["ttft_ms"][stat] for row in rows], style, marker="o", color=f"C{number}",
                    label=f"{label} {stat}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("context (input tokens, middle of each doubling bucket)")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title("TTFT vs context tokens")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _capacity(plt, runs: Sequence[Run]):
    """Each search's probes: the share of good requests (or plays) with its 95 % interval against
    the load, the target, and the capacity's interval shaded."""
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for number, run in enumerate(runs):
        found = run.doc["capacity"]
        probes = sorted((p for p in found["probes"] if p["attainment"] is not None), key=lambda p: p["load"])
        loads = [p["load"] for p in probes]
        shares = [100 * p["attainment"] for p in probes]
        below = [100 * (p["attainment"] - p["interval"][0]) for p in probes]
        above = [100 * (p["interval"][1] - p["attainment"]) for p in probes]
        ax.errorbar(loads, shares, yerr=[below, above], fmt="o-", color=f"C{number}", capsize=3,
                    label=f"{run.name}: {found['slo']['name']}" if len(runs) > 1 else found["slo"]["name"])
        if found["low"] is not None or found["high"] is not None:
            low = found["low"] if found["low"] is not None else min(loads)
            high = found["high"] if found["high"] is not None else max(loads)
            ax.axvspan(low, high, color=f"C{number}", alpha=0.15)
        if found["capacity"] is not None:
            ax.axvline(found["capacity"], color=f"C{number}", linestyle=":", linewidth=1)
    target = 100 * runs[0].doc["capacity"]["target"]
    ax.axhline(target, color="k", linestyle="--", linewidth=1, label=f"target {target:g} %")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"load ({runs[0].doc['capacity']['unit']})")
    ax.set_ylabel(f"good {runs[0].doc['capacity']['over']} (%)")
    ax.set_title("Capacity search: attainment against load (shaded: the capacity's interval)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _midpoint(bounds: Sequence[Any]) -> float:
    """The middle of a context bucket [low, high); the open last one (high null) as if it doubled too."""
    low, high = bounds
    return (low + high) / 2 if high is not None else 1.5 * low


def _stat(level: dict[str, Any] | None, metric: str, stat: str) -> float | None:
    if level is None or level["failed"]:
        return None
    return level["metrics"][metric]["stats"].get(stat)


def _short(label: str) -> str:
    return label.replace("conc ", "c")
