"""Pareto frontier of a sweep: throughput per GPU against interactivity and against E2EL.

A level is on a frontier when no other (non-failed) level is at least as good on both axes and
better on one. Axes: output tokens/s per GPU (higher is better) against p50 interactivity
(tokens/s/user, higher is better), and against p90 E2EL (lower is better).
"""

from __future__ import annotations

from typing import Any


def _frontier(points: list[tuple[int, float, float]]) -> list[int]:
    """Indices of points (index, x up-is-better, y up-is-better) that nothing dominates."""
    keep = []
    for i, x, y in points:
        dominated = any(
            (x2 >= x and y2 >= y) and (x2 > x or y2 > y) for j, x2, y2 in points if j != i
        )
        if not dominated:
            keep.append(i)
    return keep


def pareto(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """{"points": [...], "tput_per_gpu_vs_interactivity_p50": [level index...],
    "tput_per_gpu_vs_e2el_p90": [level index...]} over the levels that did not fail."""
    points = []
    for index, level in enumerate(levels):
        if level["failed"]:
            continue
        points.append({
            "level": index,
            "label": level.get("label"),
            "output_tokens_per_s_per_gpu": level["throughput"]["output_tokens_per_s_per_gpu"],
            "interactivity_p50": level["metrics"]["interactivity"]["stats"]["p50"],
            "e2el_p90_us": level["metrics"]["e2el"]["stats"]["p90"],
        })
    with_inter = [(p["level"], p["output_tokens_per_s_per_gpu"], p["interactivity_p50"])
                  for p in points if p["interactivity_p50"] is not None]
    with_e2el = [(p["level"], p["output_tokens_per_s_per_gpu"], -p["e2el_p90_us"])
                 for p in points if p["e2el_p90_us"] is not None]
    return {
        "points": points,
        "tput_per_gpu_vs_interactivity_p50": _frontier(with_inter),
        "tput_per_gpu_vs_e2el_p90": _frontier(with_e2el),
    }
