"""A capacity search's answer in words (the results file's `capacity` block): the one line `loadgen
capacity` ends with, and why no load held the SLO when none did."""

from __future__ import annotations

from typing import Any


def describe_capacity(found: dict[str, Any]) -> str:
    """The search's answer in one line (`loadgen capacity`'s last words before the results path)."""
    unit = found["unit"]
    what = f"capacity at SLO {found['slo']['name']}"
    if found["slo"]["name"] != found["slo"]["spec"]:
        what += f" ({found['slo']['spec']})"
    what += f", {found['target']:.0%} of {found['over']}"
    probes = found["probes"]
    loads = sorted(p["load"] for p in probes)
    if not probes:
        return f"{what}: no probe was measured"
    if found["below_range"]:
        return f"{what}: below the lightest load probed ({_load(loads[0], unit)} failed)"
    low = "?" if found["low"] is None else _load(found["low"], unit, bare=True)
    high = "?" if found["high"] is None else _load(found["high"], unit, bare=True)
    notes = []
    if found["low"] is None:
        needs = found.get("held_window_s")
        how = (f"an all-good probe at {_load(found['capacity'], unit)} would need a window of about {needs:.0f} s "
               "at the clustering these probes show" if needs else "more requests per probe")
        notes.append(f"no probe showed the SLO held with 95 % confidence ({how}: a longer --duration, or more "
                     "--confirm-windows)")
    if found["high"] is None and not found["above_range"]:
        notes.append("no probe showed it failed with 95 % confidence")
    if not found["consistent"]:
        notes.append("the probes contradict each other beyond their intervals (a load held that a lighter one "
                     "failed): the interval spans both claims; a longer --duration averages more bursts per probe")
    elif found["dispersion"] > 1:
        notes.append(f"effective sizes divided by {found['dispersion']:.2g} for the probes' disagreement "
                     "(loadgen/capacity/dispersion.py)")
    if found["capacity"] is None:  # above_range: the heaviest probe still held
        point = f"at least {_load(loads[-1], unit)} (the heaviest load probed held)"
    else:
        point = _load(found["capacity"], unit)
    gpus = found["gpus"]
    per_gpu = found["per_gpu"]["capacity"]
    per = f", {per_gpu:g} per GPU ({gpus} GPUs)" if per_gpu is not None and gpus > 1 else ""
    early = sum(1 for p in probes if p["stopped_early"])
    confirming = sum(1 for p in probes if p.get("confirming"))
    longer = f", {confirming} confirming over a longer window" if confirming else ""
    note = "".join(f"; {text}" for text in notes)
    return f"{what}: {point} [{low}, {high}]{per}; {len(probes)} probes ({early} decided early{longer}){note}"


def _load(value: float, unit: str, bare: bool = False) -> str:
    text = f"{value:g}"
    return text if bare else f"{text} {unit}"


def unheld_slo(found: dict[str, Any], levels: list[dict[str, Any]]) -> str:
    """Why no load held the SLO: the lightest probe's share and the bound it broke most."""
    lightest = min(found["probes"], key=lambda p: p["load"])
    level = next(lv for lv in levels if lv["label"] == lightest["label"])
    entry = next(e for e in level["slo"] if e["name"] == found["slo"]["name"])
    worst = entry["worst"]
    total = entry["requests"]["total"]
    broke = f"; the bound broken most: {worst} ({entry['violations'][worst]} of {total} requests)" if worst else ""
    share = "no request measured" if lightest["attainment"] is None else f"{lightest['attainment']:.1%} good"
    where = _load(lightest["load"], found["unit"])
    return (f"the SLO {found['slo']['spec']} is not held even at the lightest load ({where}: {share}, "
            f"target {found['target']:.0%}){broke}")
