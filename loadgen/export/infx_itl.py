"""The raw per-chunk ITL of a run's levels, read from its `--per-request` file, for the fixed-sequence
InferenceX rows (`loadgen report --format infx --per-request FILE`).

InferenceX's fixed-sequence client keeps every gap between two consecutive streamed chunks of a
successful request (utils/bench_serving/backend_request_func.py) and takes its statistics over all of
them (benchmark_serving.py); a results file keeps those gaps only as an HDR histogram (3 significant
digits), while the per-request file keeps each counted request's chunk arrival times (`chunk_ns`),
whose differences are the gaps themselves.

A level's counted requests are found by its label, in file order (a level's repeats run one after
another and share it), as many as the level counted; they must be the level's own requests (the same
play, turn and TTFT as its request columns), else the file belongs to another run and is refused.
"""

from __future__ import annotations

from collections import defaultdict, deque
from pathlib import Path

import numpy as np
import orjson

from loadgen.export.infx_identity import ExportError
from loadgen.report.runs import Run

RequestKey = tuple[int, int, int]  # play, turn, TTFT in microseconds: a counted request of a level


def level_chunk_gaps(path: Path, run: Run) -> list[np.ndarray]:
    """Per level of the run, in its order: the gaps in seconds between consecutive content chunks of
    its counted requests."""
    by_label = _counted_requests(path)
    gaps = []
    for level in run.doc["levels"]:
        label = level.get("label") or level["mode"]
        queue = by_label[label]
        taken = [queue.popleft() for _ in range(min(level["counts"]["requests_ok"], len(queue)))]
        columns = level["requests"]
        if sorted(key for key, _ in taken) != sorted(zip(columns["play"], columns["turn"], columns["ttft_us"])):
            raise ExportError(f"--per-request {path}: its counted requests of {label} are not those of run "
                              f"{run.name} (the file of another run?)")
        gaps.append(np.concatenate([chunk_gaps for _, chunk_gaps in taken]) if taken else np.empty(0))
    return gaps


def _counted_requests(path: Path) -> dict[str, deque[tuple[RequestKey, np.ndarray]]]:
    """The counted requests of the file by level label, in file order, each with its chunk gaps."""
    by_label: dict[str, deque[tuple[RequestKey, np.ndarray]]] = defaultdict(deque)
    try:
        with path.open("rb") as handle:
            for number, line in enumerate(handle, 1):
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise ExportError(f"--per-request {path}:{number}: not a JSON line ({exc})") from None
                if record.get("counted"):
                    # the results' TTFT column is the same integer division of the same stamps
                    key = (record["play"], record["turn"], (record["first_ns"] - record["due_ns"]) // 1000)
                    chunk_gaps = np.diff(np.asarray(record["chunk_ns"], dtype=np.int64)) / 1e9
                    by_label[record["level"]].append((key, chunk_gaps))
    except OSError as exc:
        raise ExportError(f"--per-request {path}: {exc.strerror or exc}") from None
    return by_label
