"""Which levels a run plays, in which order: a fixed sweep (`--conc`/`--rate`, each level
`--repeat` times), or the capacity search (loadgen/capacity/search.py), whose probes are levels
chosen from the ones measured before them, and whose answer the results file gains as its
`capacity` block. The replay (loadgen/run/replay.py) asks a `Sweep` for its next level, shows it
each level's summary, and lets it end a level's window early.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from loadgen.capacity.config import SearchConfig
from loadgen.capacity.search import CapacitySearch, Probe
from loadgen.results.attainment import Share
from loadgen.results.slo import Slo
from loadgen.run.level import LevelLoad


@dataclass(frozen=True, slots=True)
class NextLevel:
    index: int  # keys the level's plan: a repeat runs an index again (loadgen/run/runner.py)
    load: LevelLoad
    repeat: int = 0
    repeats: int = 1


class Sweep(Protocol):
    @property
    def live_slo(self) -> Slo | None:
        """The SLO each level tallies while it runs, for `early_stop` (None: no tally)."""
        ...

    def sizing(self) -> list[LevelLoad]:
        """Every level the sweep may run, or its heaviest: connections and workers are sized to them."""
        ...

    def next_level(self) -> NextLevel | None:
        """The next level to run; None when the sweep is done."""
        ...

    def observe(self, summary: dict[str, Any]) -> None:
        """A level's results-file entry, once it is measured."""
        ...

    def early_stop(self, snap: dict[str, Any], duration_s: float) -> str | None:
        """A reason to end the running level's window now (`snap`: progress.snapshot's), or None."""
        ...

    def results(self, gpus: int) -> dict[str, Any]:
        """What the sweep adds to the results file, at its top level."""
        ...


class FixedSweep:
    """The levels in order, each `repeats` times in a row."""

    def __init__(self, levels: list[LevelLoad], repeats: int) -> None:
        self._levels, self._repeats = levels, repeats
        self._order = [NextLevel(i, load, r, repeats) for i, load in enumerate(levels) for r in range(repeats)]

    @property
    def live_slo(self) -> Slo | None:
        return None

    def sizing(self) -> list[LevelLoad]:
        return self._levels

    def next_level(self) -> NextLevel | None:
        return self._order.pop(0) if self._order else None

    def observe(self, summary: dict[str, Any]) -> None:
        pass

    def early_stop(self, snap: dict[str, Any], duration_s: float) -> str | None:
        return None

    def results(self, gpus: int) -> dict[str, Any]:
        return {}


class CapacitySweep:
    """The capacity search's probes as levels, the search told of each one's attainment."""

    def __init__(self, config: SearchConfig) -> None:
        self.config = config
        self.search = CapacitySearch(config)
        self._pending: tuple[float, str | None] | None = None  # the running probe's load and early stop

    @property
    def live_slo(self) -> Slo | None:
        return self.config.slo

    def sizing(self) -> list[LevelLoad]:
        return [self._level_load(self.config.bounds[1])]

    def next_level(self) -> NextLevel | None:
        probe = self.search.next_probe()
        if probe is None:
            return None
        self._pending = (probe.load, None)
        # each probe its own level index, as a sweep's levels have: salts of its own (plan.LanePlays)
        return NextLevel(len(self.search.probes), self._level_load(probe.load, probe.window_s))

    def _level_load(self, load: float, window_s: float | None = None) -> LevelLoad:
        mode = self.config.mode
        if mode == "closed":
            return LevelLoad("closed", concurrency=int(load), window_s=window_s)
        if mode == "poisson":
            return LevelLoad("poisson", rate=load, window_s=window_s)
        return LevelLoad("mooncake", time_scale=1 / load, window_s=window_s)

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
        reason = self.search.early_verdict(snap["slo"], snap["inflight"], snap["window_elapsed_s"],
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
