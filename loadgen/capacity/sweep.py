"""The capacity search as a replay's sweep (loadgen/run/sweep.py): each probe is a level of the run,
chosen from the probes measured before it, and the results file gains a `capacity` block."""

from __future__ import annotations

import argparse
from typing import Any

from loadgen.capacity.config import DEFAULT_SLO, SearchConfig
from loadgen.capacity.search import CapacitySearch, Probe
from loadgen.results.attainment import ClusterSums, Share
from loadgen.results.slo import Slo, parse_slo
from loadgen.run.level import LevelLoad
from loadgen.run.sweep import NextLevel
from traces import TraceSet


class CapacitySweep:
    def __init__(self, config: SearchConfig) -> None:
        self.config = config
        self.search = CapacitySearch(config)
        self._pending: tuple[float, str | None] | None = None  # the running probe's load and early stop

    @property
    def live_slo(self) -> Slo | None:
        return self.config.slo

    def sizing(self) -> list[LevelLoad]:
        return [self._spec(self.config.bounds[1], carry=False)]

    def next_level(self) -> NextLevel | None:
        load = self.search.next_load()
        if load is None:
            return None
        self._pending = (load, None)
        # a closed-loop probe's lanes go on with the sessions the previous probe's lanes played
        return NextLevel(len(self.search.probes), self._spec(load, carry=bool(self.search.probes)))

    def _spec(self, load: float, carry: bool) -> LevelLoad:
        mode = self.config.mode
        if mode == "closed":
            return LevelLoad("closed", concurrency=int(load), carry=carry)
        if mode == "poisson":
            return LevelLoad("poisson", rate=load)
        return LevelLoad("mooncake", time_scale=1 / load)

    def observe(self, summary: dict[str, Any]) -> None:
        assert self._pending is not None, "observe follows next_level"
        load, early = self._pending
        entry = next(e for e in summary["slo"] if e["name"] == self.config.slo.name)
        self.search.observe(Probe(load, share_of(entry[self.config.over]), summary["label"], summary["window_s"],
                                  early))
        self._pending = None

    def early_stop(self, snap: dict[str, Any], duration_s: float) -> str | None:
        if self._pending is None or not snap.get("window_open") or snap.get("stopping") or "slo" not in snap:
            return None
        reason = self.search.early_verdict(ClusterSums(*snap["slo"]), snap["inflight"], snap["window_elapsed_s"],
                                           duration_s)
        if reason is not None:
            self._pending = (self._pending[0], reason)
        return reason

    def results(self, gpus: int) -> dict[str, Any]:
        return {"capacity": self.search.result(gpus)}


def share_of(entry: dict[str, Any]) -> Share:
    """A level's `slo` entry's requests or sessions block, back as a Share."""
    interval = entry.get("interval") or (None, None)
    return Share(entry["total"], entry["good"], interval[0], interval[1], entry.get("effective_n") or 0.0)


def search_config(args: argparse.Namespace, traces: TraceSet, slos: tuple[Slo, ...]) -> SearchConfig:
    """The search's settings from `loadgen capacity`'s (or `bench --capacity`'s) flags."""
    mode = "mooncake" if traces.format == "mooncake" else "poisson" if args.open_loop else "closed"
    return SearchConfig(slo=slos[0] if slos else parse_slo(DEFAULT_SLO), mode=mode, target=args.attainment,
                        over=args.over, low=args.low, high=args.high, resolution=args.resolution,
                        max_probes=args.max_probes, early_stop=not args.no_early_stop)


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
        notes.append("no probe showed the SLO held with 95 % confidence (more requests per probe: a longer "
                     "--duration)")
    if found["high"] is None and not found["above_range"]:
        notes.append("no probe showed it failed with 95 % confidence")
    if found["capacity"] is None:  # above_range: the heaviest probe still held
        point = f"at least {_load(loads[-1], unit)} (the heaviest load probed held)"
    else:
        point = _load(found["capacity"], unit)
    gpus = found["gpus"]
    per_gpu = found["per_gpu"]["capacity"]
    per = f", {per_gpu:g} per GPU ({gpus} GPUs)" if per_gpu is not None and gpus > 1 else ""
    early = sum(1 for p in probes if p["stopped_early"])
    note = "".join(f"; {text}" for text in notes)
    return f"{what}: {point} [{low}, {high}]{per}; {len(probes)} probes ({early} decided early){note}"


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
