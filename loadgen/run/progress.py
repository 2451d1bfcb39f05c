"""Live progress of a level: a snapshot of each share (worker) while it runs, summed, and one
status line: phase, elapsed / planned time, requests done and in flight, errors, output tokens/s,
and the age of the slowest request still in flight (a slow server and a hung one look alike
without it).

On a terminal the line is redrawn in place every second; when stdout is not a terminal a line
is printed every few seconds; with --quiet nothing.
"""

from __future__ import annotations

import functools
import operator
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from loadgen.run.level import LevelRun


def snapshot(level: LevelRun | None) -> dict[str, Any]:
    """What one share has done so far (plain data: it crosses process boundaries)."""
    if level is None:
        return {"running": False}
    now = time.perf_counter_ns()
    oldest = next(iter(level.inflight_since.values()), None)
    return {
        "running": True,
        "window_open": level.window_start_ns is not None,
        "window_elapsed_s": max(0.0, (now - level.window_start_ns) / 1e9) if level.window_start_ns is not None else 0.0,
        "stopping": level.stopping,
        "ok": level.ok, "warmup_ok": level.warmup_ok,
        "errors": sum(level.errors.values()) + sum(level.warmup_errors.values()),
        "inflight": level.inflight, "output_tokens": level.output_tokens,
        "slowest_inflight_s": (now - oldest) / 1e9 if oldest is not None else 0.0,
        "lanes_warm": level.lanes_warm,
        **({"slo": level.slo_sums()} if level.slo_tally is not None else {}),
    }


def combine(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The snapshots of all shares as one."""
    running = [p for p in parts if p.get("running")]
    if not running:
        return {"running": False}
    total = {key: sum(p[key] for p in running) for key in ("ok", "warmup_ok", "errors", "inflight",
                                                          "output_tokens", "lanes_warm")}
    if all("slo" in p for p in running):  # the live SLO's tallies (LiveSums), added over the shares
        total["slo"] = functools.reduce(operator.add, (p["slo"] for p in running))
    return {**total, "running": True,
            "window_open": all(p["window_open"] for p in running),
            "window_elapsed_s": max(p["window_elapsed_s"] for p in running),
            "stopping": any(p["stopping"] for p in running),
            "slowest_inflight_s": max(p["slowest_inflight_s"] for p in running)}


def describe(label: str, snap: dict[str, Any], elapsed_s: float, duration_s: float, warmup_timeout_s: float,
             drain_timeout_s: float) -> str:
    """One status line of the level `label`, `elapsed_s` after it started."""
    if not snap.get("running"):
        return f"[{label}] starting {elapsed_s:.0f} s"
    window = snap["window_elapsed_s"]
    if not snap["window_open"]:
        where = f"warm-up {elapsed_s:.0f} s (limit {warmup_timeout_s:g} s) | {snap['warmup_ok']} warm-up done"
        rate = ""
    elif window < duration_s and not snap["stopping"]:
        where = f"window {window:.0f}/{duration_s:g} s | {snap['ok']} ok"
        rate = f" | {snap['output_tokens'] / max(window, 1e-9):.0f} out tok/s"
    else:
        where = f"drain {window - duration_s:.0f} s (limit {drain_timeout_s:g} s) | {snap['ok']} ok"
        rate = f" | {snap['output_tokens'] / max(min(window, duration_s), 1e-9):.0f} out tok/s"
    slowest = f" | slowest in flight {snap['slowest_inflight_s']:.1f} s" if snap["inflight"] else ""
    return f"[{label}] {where}, {snap['inflight']} in flight, {snap['errors']} errors{rate}{slowest}"


@dataclass
class ProgressPrinter:
    """Prints status lines: in place on a terminal, one every `piped_every_s` otherwise."""

    piped_every_s: float
    enabled: bool = True
    stream: TextIO | None = None  # default: sys.stdout at the time of construction

    def __post_init__(self) -> None:
        self.stream = self.stream or sys.stdout
        self.tty = self.stream.isatty()
        self._last = 0.0
        self._drawn = False

    def show(self, line: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            print(f"\r\033[K{line}", end="", file=self.stream, flush=True)
            self._drawn = True
            return
        now = time.monotonic()
        if not self._last:
            self._last = now  # the first line comes after one interval: short levels print none
        elif now - self._last >= self.piped_every_s:
            self._last = now
            print(line, file=self.stream, flush=True)

    def say(self, text: str) -> None:
        """A permanent line (level header, table): clears the status line first."""
        if not self.enabled:
            return
        self.clear()
        print(text, file=self.stream, flush=True)

    def clear(self) -> None:
        if self._drawn:
            print("\r\033[K", end="", file=self.stream, flush=True)
            self._drawn = False
        self._last = 0.0
