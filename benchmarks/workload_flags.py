"""The calibration scripts' shared workload flags: the engine (--model, --device) and the bundled
sessions' scaling, defaulting to `loadgen bench`'s tiny preset (loadgen/run/presets.py), read from there."""

from __future__ import annotations

import argparse

from loadgen.run.presets import BENCH_PRESETS, CPU_MODEL

TINY = BENCH_PRESETS[CPU_MODEL]


def add_workload_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=CPU_MODEL)
    p.add_argument("--device", default="cpu")
    p.add_argument("--token-scale", type=float, default=TINY.token_scale)
    p.add_argument("--think-time-scale", type=float, default=TINY.think_time_scale)
    p.add_argument("--think-time-cap", type=float, default=TINY.think_time_cap)
