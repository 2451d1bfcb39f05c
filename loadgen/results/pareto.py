"""Pareto frontiers of one sweep or of several: throughput per GPU against latency axes.

Every non-failed level of every results file is one point. Its throughput is output tokens/s
per GPU (higher is better); it is plotted against three user-side axes:

- `interactivity`: p50 interactivity, tokens/s/user (higher is better);
- `e2el`: p90 end-to-end latency, seconds (lower is better);
- `e2e_interactivity`: 1 / p90(E2EL / OSL), tokens/s/user (higher is better), the AgentX
  headline ("e2e-normalized interactivity").

A point is on an axis' frontier when no other point is at least as good on both throughput and
that axis and strictly better on one (equal points do not dominate each other: ties all stay).
InferenceX's rule on top: a point shows on *any* frontier only if it is also on the
e2e-normalized one. We apply it as an intersection: the `interactivity` and `e2el` frontiers
hold the points that are non-dominated on their own axis among all points AND on the normalized
frontier, so a frontier point is never beaten on its own chart by a point the rule removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loadgen.results.metric_registry import STATISTIC_BY_NAME, stored_value

NORMALIZED = "e2e_interactivity"
# axis name -> (Point attribute, the statistic it holds)
_AXIS_STATISTICS = {NORMALIZED: ("e2e_interactivity", "e2e_interactivity"),
                    "interactivity": ("interactivity_p50", "interactivity_p50"),
                    "e2el": ("e2el_p90_s", "e2el_p90")}
# axis name -> (Point attribute, +1 when higher is better / -1 when lower is better)
AXES: dict[str, tuple[str, int]] = {
    axis: (attr, +1 if STATISTIC_BY_NAME[name].higher_is_better else -1)
    for axis, (attr, name) in _AXIS_STATISTICS.items()
}


@dataclass(frozen=True, slots=True)
class Point:
    """One level as a Pareto candidate; `source` names its results file (empty for one file)."""

    source: str
    level: int
    label: str
    tput_per_gpu: float
    interactivity_p50: float | None
    e2el_p90_s: float | None
    e2e_interactivity: float | None


def e2e_interactivity(level: dict[str, Any]) -> float | None:
    """A results-file level's 1 / p90(E2EL / OSL) in tokens/s/user; None when it has no p90."""
    return stored_value(level, STATISTIC_BY_NAME["e2e_interactivity"])


def level_point(level: dict[str, Any], index: int, source: str = "") -> Point | None:
    """The Pareto point of a results-file level; None for a failed level (never a candidate)."""
    if level["failed"]:
        return None
    return Point(
        source=source,
        level=index,
        label=level.get("label") or f"level {index}",
        tput_per_gpu=float(level["throughput"]["output_tokens_per_s_per_gpu"]),
        interactivity_p50=stored_value(level, STATISTIC_BY_NAME["interactivity_p50"]),
        e2el_p90_s=stored_value(level, STATISTIC_BY_NAME["e2el_p90"]),
        e2e_interactivity=e2e_interactivity(level),
    )


def non_dominated(points: Sequence[Point], axis: str) -> list[Point]:
    """Points that no other point dominates on (throughput, axis); points missing the axis drop out."""
    attr, sign = AXES[axis]
    scored = [(p, p.tput_per_gpu, sign * getattr(p, attr)) for p in points if getattr(p, attr) is not None]
    keep = []
    for p, x, y in scored:
        if not any(x2 >= x and y2 >= y and (x2 > x or y2 > y) for _, x2, y2 in scored):
            keep.append(p)
    return keep


def frontiers(points: Sequence[Point]) -> dict[str, list[Point]]:
    """{axis: frontier points, by throughput descending} with InferenceX's normalized-frontier rule."""
    normalized = non_dominated(points, NORMALIZED)
    allowed = set(normalized)
    out = {NORMALIZED: normalized}
    for axis in AXES:
        if axis != NORMALIZED:
            out[axis] = [p for p in non_dominated(points, axis) if p in allowed]
    return {axis: sorted(chosen, key=lambda p: -p.tput_per_gpu) for axis, chosen in out.items()}


def sweep_points(runs: Sequence[tuple[str, Sequence[dict[str, Any]]]]) -> list[Point]:
    """Points of every non-failed level of several runs, given as (source name, levels)."""
    points = []
    for source, levels in runs:
        for index, level in enumerate(levels):
            point = level_point(level, index, source)
            if point is not None:
                points.append(point)
    return points


def pareto(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """The results file's `pareto` entry for one sweep: points and each frontier as level indices.

    {"points": [...], "tput_per_gpu_vs_interactivity_p50": [...], "tput_per_gpu_vs_e2el_p90": [...],
    "tput_per_gpu_vs_e2e_interactivity": [...], "rule": "..."}
    """
    points = sweep_points([("", levels)])
    chosen = frontiers(points)
    return {
        "points": [{"level": p.level, "label": p.label, "output_tokens_per_s_per_gpu": p.tput_per_gpu,
                    "interactivity_p50": p.interactivity_p50,
                    "e2el_p90_us": round(p.e2el_p90_s * 1e6) if p.e2el_p90_s is not None else None,
                    "e2e_interactivity": p.e2e_interactivity} for p in points],
        "tput_per_gpu_vs_interactivity_p50": sorted(p.level for p in chosen["interactivity"]),
        "tput_per_gpu_vs_e2el_p90": sorted(p.level for p in chosen["e2el"]),
        "tput_per_gpu_vs_e2e_interactivity": sorted(p.level for p in chosen[NORMALIZED]),
        "rule": "a level is on a frontier only if it is also on the e2e-normalized one (InferenceX)",
    }
