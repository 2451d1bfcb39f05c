"""Which levels a run plays, in which order: a fixed sweep (`--conc`/`--rate`, each level
`--repeat` times), or a search that picks each level from the ones measured before it
(loadgen/capacity.py). The replay (loadgen/run/replay.py) asks a `Sweep` for its next level, shows it
each level's summary, and lets it end a level's window early.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from loadgen.results.slo import Slo
from loadgen.run.level import LevelLoad


@dataclass(frozen=True, slots=True)
class NextLevel:
    index: int  # keys the level's plan: a repeat runs an index again (loadgen/run/runner.py)
    spec: LevelLoad
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
        self._order = [NextLevel(i, spec, r, repeats) for i, spec in enumerate(levels) for r in range(repeats)]

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
