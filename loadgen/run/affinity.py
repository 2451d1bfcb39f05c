"""CPU placement of the processes an experiment starts: CPU lists ("0", "2-5,8") and starting a
child on them.

Why: on a shared host the server's engine, its HTTP process and the load generator otherwise
share every core, and identical runs differ by how the scheduler happened to interleave them
(`benchmarks/noise_source.py placement` compares placed runs with free ones). Linux only, as
`taskset` is; elsewhere a CPU list is refused with a message saying so.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


class CpuListError(ValueError):
    """A CPU list that cannot be used here; the message names `where` (the key or flag)."""


def parse_cpus(text: str, where: str) -> frozenset[int]:
    """CPUs of a list such as "0", "2-5" or "0,2-3", each one this process may run on."""
    if not hasattr(os, "sched_setaffinity"):
        raise CpuListError(f"{where}: CPU placement needs Linux (sched_setaffinity); this system has none")
    cpus: set[int] = set()
    for part in str(text).split(","):
        low, _, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise CpuListError(f"{where}: expected CPU numbers and ranges such as '0' or '2-5,8', "
                               f"got {text!r}") from None
        if first < 0 or last < first:
            raise CpuListError(f"{where}: {part.strip()!r} is not a range of CPU numbers (in {text!r})")
        cpus.update(range(first, last + 1))
    allowed = os.sched_getaffinity(0)
    missing = sorted(cpus - allowed)
    if missing:
        raise CpuListError(f"{where}: CPU {', '.join(map(str, missing))} not available here "
                           f"(this process may use {format_cpus(allowed)})")
    return frozenset(cpus)


def format_cpus(cpus: set[int] | frozenset[int]) -> str:
    """The shortest list form: {0, 1, 2, 5} -> "0-2,5"."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


@contextmanager
def placed_on(cpus: frozenset[int] | None) -> Iterator[None]:
    """Children started inside the block run on `cpus` (None: where this thread runs). The calling
    thread's own mask is changed for the block and restored: a child inherits the mask of the
    thread that forks it, and this needs no code between fork and exec (preexec_fn), which is
    unsafe in a process with threads."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
