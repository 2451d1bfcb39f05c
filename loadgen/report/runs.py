"""The results files a report reads: each one validated and named for tables and legends, and the
Pareto points and frontiers over all their levels (loadgen/results/pareto.py)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.results.pareto import Point, frontiers, level_point

RESULT_NAME = "result.json"  # what `loadgen replay --out DIR` writes in DIR


@dataclass(frozen=True)
class Run:
    """One results file: where it is, a short unique name for tables and legends, its content."""

    path: Path
    name: str
    doc: dict[str, Any]


def resolve(path: str | os.PathLike) -> Path:
    """A results file, or a folder holding result.json."""
    path = Path(path)
    return path / RESULT_NAME if path.is_dir() else path


def load_runs(paths: Sequence[str | os.PathLike]) -> list[Run]:
    """Read and validate every file; a bad one raises UsageError naming the file and field."""
    from loadgen.errors import UsageError
    from loadgen.results.file import ResultsError, read_results

    files = [resolve(p) for p in paths]
    docs = []
    for path in files:
        try:
            docs.append(read_results(path))
        except ResultsError as exc:
            raise UsageError(str(exc)) from exc
    return [Run(path, name, doc) for path, name, doc in zip(files, short_names(files), docs)]


def short_names(paths: Sequence[Path]) -> list[str]:
    """The fewest trailing path parts (without the .json suffix) that tell the files apart;
    a folder's result.json is named by its folder."""
    parts = [list(p.with_suffix("").parts) if p.suffix == ".json" else list(p.parts) for p in paths]
    parts = [ps[:-1] if len(ps) > 1 and ps[-1] == Path(RESULT_NAME).stem else ps for ps in parts]
    for depth in range(1, max((len(ps) for ps in parts), default=1) + 1):
        names = ["/".join(ps[-depth:]) for ps in parts]
        if len(set(names)) == len(names):
            return names
    return [f"{name}#{i}" for i, name in enumerate("/".join(ps) for ps in parts)]


def run_points(runs: Sequence[Run]) -> list[Point]:
    points = []
    for run in runs:
        for index, level in enumerate(run.doc["levels"]):
            point = level_point(level, index, run.name)
            if point is not None:
                points.append(point)
    return points


def frontier_keys(runs: Sequence[Run]) -> dict[str, set[tuple[str, int]]]:
    """{axis: {(run name, level index)}} of the frontiers over all levels of all runs."""
    return {axis: {(p.source, p.level) for p in chosen} for axis, chosen in frontiers(run_points(runs)).items()}
