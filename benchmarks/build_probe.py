"""`loadgen` with a CPU probe on request building: how much of the client's CPU goes into
synthesising prompts and encoding request bodies (benchmarks/many_sessions.py).

Run as `BUILD_PROBE_DIR=DIR python benchmarks/build_probe.py replay [loadgen replay flags]`. Every
client process (the replay's own and its `--workers` processes, which import this file again as
their main module when they are spawned) times each `PromptSynth.prompt` and
`HttpTransport._body` call with its thread's CPU clock (the event loop's thread builds every
request) and, when it exits, writes `probe-<pid>.json` into DIR: calls, CPU and wall
nanoseconds of each, and the bytes of the bodies encoded.
"""

from __future__ import annotations

import json
import multiprocessing.util
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROBE_DIR_ENV = "BUILD_PROBE_DIR"
PARTS = ("prompt", "body")


def install(folder: Path) -> None:
    """Wrap the two building steps of this process with CPU timers; write the tally at exit."""
    from loadgen.transport.http import HttpTransport
    from traces import PromptSynth

    tally = {f"{part}_{key}": 0 for part in PARTS for key in ("calls", "cpu_ns", "wall_ns")}
    tally["body_bytes"] = 0

    def timed(part: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
            out = method(*args)
            tally[f"{part}_cpu_ns"] += time.thread_time_ns() - cpu
            tally[f"{part}_wall_ns"] += time.perf_counter_ns() - wall
            tally[f"{part}_calls"] += 1
            if part == "body":
                tally["body_bytes"] += len(out)
            return out

        return call

    PromptSynth.prompt = timed("prompt", PromptSynth.prompt)  # type: ignore[method-assign]
    HttpTransport._body = timed("body", HttpTransport._body)  # type: ignore[method-assign]
    # multiprocessing's exit hook runs in a worker process too, where atexit's handlers do not
    multiprocessing.util.Finalize(None, _write, args=(folder, tally), exitpriority=10)


def _write(folder: Path, tally: dict[str, int]) -> None:
    (folder / f"probe-{os.getpid()}.json").write_text(json.dumps(tally))


def read(folder: Path) -> dict[str, int]:
    """The tallies of every client process of a run, added."""
    total: dict[str, int] = {}
    for path in folder.glob("probe-*.json"):
        for key, value in json.loads(path.read_text()).items():
            total[key] = total.get(key, 0) + value
    return total


if __name__ in ("__main__", "__mp_main__") and os.environ.get(PROBE_DIR_ENV):
    install(Path(os.environ[PROBE_DIR_ENV]))

if __name__ == "__main__":
    from loadgen.cli import main

    sys.exit(main(sys.argv[1:]))
