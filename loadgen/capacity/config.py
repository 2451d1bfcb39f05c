"""The capacity search's settings (loadgen/capacity/search.py): one frozen dataclass, whose
defaults `loadgen capacity` and `loadgen bench --capacity` read for their flags. Kept free of
numpy so that building the parser stays light."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loadgen.defaults import DEFAULTS
from loadgen.results.slo import DEFAULT_TARGET, Slo, parse_slo

if TYPE_CHECKING:
    from traces import TraceSet

OVER = ("requests", "sessions")
DEFAULT_SLO = "standard"  # the tier searched when no --slo is given
# per mode: (first probe, largest probe); agents, requests/s, times the recorded rate
DEFAULT_RANGES = {"closed": (1.0, 256.0), "poisson": (0.1, 1000.0), "mooncake": (0.25, 64.0)}
UNITS = {"closed": "agents", "poisson": "requests/s", "mooncake": "x recorded rate"}


@dataclass(frozen=True, slots=True)
class SearchConfig:
    """What the search looks for and how hard it looks; each default once (the CLI reads them)."""

    slo: Slo
    mode: str = "closed"  # "closed" (agents) | "poisson" (requests/s) | "mooncake" (x the recorded rate)
    target: float = DEFAULT_TARGET
    over: str = "requests"  # the share that must reach the target: of requests, or of session plays
    low: float | None = None  # the first probe's load (None: the mode's, DEFAULT_RANGES)
    high: float | None = None  # the largest load probed (None: the mode's)
    resolution: float = 0.1  # bisect until the bracket is no wider than this share of its lower end
    max_probes: int = 12
    early_stop: bool = True
    min_window_share: float = 0.25  # a probe runs at least this share of its window before stopping early
    min_requests: int = 24  # ... and has finished at least this many requests
    window_s: float = DEFAULTS.duration_s  # the run's window (--duration sets it); a confirming probe's is longer
    confirm_windows: float = 4.0  # a probe sent to show the held end decisively runs up to this many windows

    @property
    def integer(self) -> bool:
        return self.mode == "closed"

    @property
    def bounds(self) -> tuple[float, float]:
        """(first probe, largest probe) of the load."""
        low, high = DEFAULT_RANGES[self.mode]
        return (low if self.low is None else self.low), (high if self.high is None else self.high)


SEARCH = SearchConfig(slo=parse_slo(DEFAULT_SLO))  # the default search: its fields are the flags' defaults


def add_search_flags(p: argparse.ArgumentParser) -> None:
    """The capacity search's flags (`loadgen capacity`, `loadgen bench --capacity`); the SLO and
    the attainment target are --slo (its first; default the standard tier) and --attainment."""
    ranges = "; ".join(f"{mode} {low:g}..{high:g} {UNITS[mode]}" for mode, (low, high) in DEFAULT_RANGES.items())
    g = p.add_argument_group("capacity search")
    g.add_argument("--open-loop", action="store_true",
                   help="search the largest Poisson request rate (requests/s over the trace's requests) instead of "
                   "the largest number of concurrent agents; Mooncake traces are always searched open loop, as "
                   "a multiple of their recorded rate")
    g.add_argument("--over", choices=OVER, default=SEARCH.over,
                   help="the share that must reach --attainment: of requests, or of session plays whose every "
                   f"request was good (default {SEARCH.over})")
    g.add_argument("--low", type=float, metavar="LOAD",
                   help=f"the first probe's load (default by mode: {ranges})")
    g.add_argument("--high", type=float, metavar="LOAD", help="the largest load probed (default: see --low)")
    g.add_argument("--resolution", type=float, default=SEARCH.resolution, metavar="F",
                   help="bisect until the bracket is no wider than this share of the load that held (and one agent) "
                   f"(default {SEARCH.resolution:g})")
    g.add_argument("--max-probes", type=int, default=SEARCH.max_probes, metavar="N",
                   help=f"stop the search after N probes (default {SEARCH.max_probes})")
    g.add_argument("--confirm-windows", type=float, default=SEARCH.confirm_windows, metavar="N",
                   help="when no probe has yet shown the SLO held, a probe sent below the bracket to show it runs a "
                   "window long enough that a share with no failures would, at the clustering the probes show, up "
                   "to N windows; when N windows could not, the search ends there (1: every probe one window; "
                   f"default {SEARCH.confirm_windows:g})")
    g.add_argument("--no-early-stop", action="store_true",
                   help="run every probe's whole window, even when its verdict is decided early")


def check_search_flags(args: argparse.Namespace) -> None:
    """ValueError naming the flag."""
    for flag, value in (("--low", args.low), ("--high", args.high)):
        if value is not None and not value > 0:
            raise ValueError(f"{flag}: must be > 0, got {value:g}")
    if args.low is not None and args.high is not None and args.high < args.low:
        raise ValueError(f"--high: {args.high:g} is below --low {args.low:g}")
    if not 0 < args.resolution < 1:
        raise ValueError(f"--resolution: must be in (0, 1), got {args.resolution:g}")
    if not args.confirm_windows >= 1:
        raise ValueError(f"--confirm-windows: must be >= 1, got {args.confirm_windows:g}")
    if args.max_probes < 2:
        raise ValueError(f"--max-probes: need at least 2 to bracket a capacity, got {args.max_probes}")


def search_config(args: argparse.Namespace, traces: TraceSet, slos: tuple[Slo, ...]) -> SearchConfig:
    """The search's settings from `loadgen capacity`'s (or `bench --capacity`'s) flags."""
    mode = "mooncake" if traces.format == "mooncake" else "poisson" if args.open_loop else "closed"
    return SearchConfig(slo=slos[0] if slos else parse_slo(DEFAULT_SLO), mode=mode, target=args.attainment,
                        over=args.over, low=args.low, high=args.high, resolution=args.resolution,
                        max_probes=args.max_probes, early_stop=not args.no_early_stop, window_s=args.duration,
                        confirm_windows=args.confirm_windows)
