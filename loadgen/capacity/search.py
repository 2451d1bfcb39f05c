"""Capacity under an SLO: the largest load (concurrent agents, or open-loop request rate) at which
a server holds an SLO at a stated attainment, found by a probe-then-bisect search, reported as an
interval read off the measured attainment curve.

Search. The first probe runs at `low`; while probes hold the SLO (the share of good requests, or
of good session plays with `over: sessions`, at or above the target) the load doubles, up to
`high`. The first probe that fails brackets the answer with the last that held, and probes
bisect the bracket (closed loop: whole agents; open loop: geometric means of rates) until it is
no wider than `resolution` of the load that held (and one agent). A bracket is only final when
its ends are decisive - a probe whose interval lies wholly above the target below it, one wholly
under above it - so a probe too close to call sends the search one step further out. Below the
bracket that step is a confirming probe, whose window is sized to show the SLO held if it comes
out all good (`held_window_s`): near capacity failures come in bursts, whose design effect
can leave a one-window share at any load too few draws to show it.

Each probe is a level as a sweep's: its lanes start afresh and warm up as a level's do; lane l
plays the same sessions from the same offset at every probe (loadgen/run/plan.py), so a probe
of N agents replays a sweep's level of N, and its warm-up finds the histories of lanes an earlier
probe primed in the server's cache. They do not go on with the previous probe's sessions to spare the warm-up: lanes
carried from probe to probe move ever later into their sessions, where contexts are longer, so
later probes would measure a heavier load than a sweep's level at the same concurrency. A probe
stops early once its verdict is decided - the interval of its share so far (clustered by play and
by time as a level's is), counting the requests still in flight as bad, is wholly above the target,
or, counting them as good, wholly under it - after a minimum share of its window and a minimum
number of requests (a saturated server's probe need not run a full window to fail).

Interval. Each probe gives a share with a 95 % interval (loadgen/results/attainment.py), and attainment
cannot improve with more load. So a probe whose interval lies above the target shows that every
lighter load holds too, and one whose interval lies under it that every heavier load fails: the
lower end of the capacity is the heaviest load that some probe at or above it shows held (the
lower ends' running maximum from the heavy side), the upper end is the last load before the
lightest one that some probe at or under it shows failed (the upper ends' running minimum from
the light side). A probe with few requests, whose interval is wide, neither drags the band down
nor pushes it up. The point estimate is where the shares, made non-increasing in the load
(pool-adjacent-violators, weighted by the probes' effective sizes), cross the target, by linear
interpolation between probes, kept inside the interval. The probes' intervals are first re-taken
with the corrections their disagreement calls for (loadgen/capacity/dispersion.py): the search's
verdicts, its early stop and the answer all read the corrected ones. Closed loop: whole agents, the largest
concurrency at or below the crossing; the upper end is one agent under the failing load. Open
loop: the upper end is the failing rate itself. Capacity per GPU divides by the GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from loadgen.capacity.config import UNITS, SearchConfig
from loadgen.capacity.dispersion import Calibration, calibrate, non_increasing
from loadgen.results.attainment import Z_95, LiveSums, Share, wilson

Z_99 = 2.575829  # the early stop's level, two-sided 99 %
CONFIRM_MARGIN = 1.25  # a confirming probe's requests over those an all-good share needs to be shown held


@dataclass(frozen=True, slots=True)
class Probe:
    """One measured level of the search."""

    load: float
    share: Share  # of requests or of plays, as the search is over
    label: str
    window_s: float
    stopped_early: str | None = None
    confirming: bool = False  # sent below the bracket, with a longer window, to show the held end

    def holds(self, target: float) -> bool:
        value = self.share.value
        return value is not None and value >= target


@dataclass(frozen=True, slots=True)
class NextProbe:
    """The load the search measures next, and for how long."""

    load: float
    window_s: float | None = None  # None: the run's window


@dataclass
class CapacitySearch:
    config: SearchConfig
    probes: list[Probe] = field(default_factory=list)
    _looked: int = 0  # the current probe's early-stop looks so far
    _confirming: NextProbe | None = None  # the confirming probe asked for, until observed

    # -- the probes ---------------------------------------------------------------------------

    def next_probe(self) -> NextProbe | None:
        """The next probe, or None when the search is done."""
        self._confirming = None
        load = self._next_load()
        if load is None:
            return None
        return self._confirming if self._confirming is not None else NextProbe(load)

    def _next_load(self) -> float | None:
        cfg = self.config
        lightest, heaviest = cfg.bounds
        if len(self.probes) >= cfg.max_probes:
            return None
        if not self.probes:
            return self._clamp(lightest)
        tried = {p.load for p in self.probes}
        verdicts = [share.verdict(cfg.target) for share in self._corrected()]
        low, high = self._bracket()
        if high is None:  # nothing failed yet: grow
            top = max(tried)
            return None if top >= heaviest else self._clamp(min(heaviest, top * 2))
        if low is None:  # the lowest load failed: nothing lower to try
            return None
        if not self._narrow(low, high):
            middle = self._middle(low, high)
            if middle not in tried:
                return middle
        # the bracket is narrow: make its ends decisive, one step further out
        if not any(p.load >= high and verdict is False for p, verdict in zip(self.probes, verdicts)):
            step = self._step_out(max(p.load for p in self.probes if p.load >= high), up=True)
            return step if step is not None and step not in tried else None
        if not any(p.load <= low and verdict is True for p, verdict in zip(self.probes, verdicts)):
            # a confirming probe: one step down from the bracket, then from the last one; a load
            # probed before for one window is measured again, for longer
            confirmed = [p.load for p in self.probes if p.confirming]
            step = self._step_out(min([low, *confirmed]), up=False)
            window = None if step is None or step in confirmed else self._confirming_window(step)
            if step is None or window is None:
                return None
            self._confirming = NextProbe(step, window)
            return step
        return None

    def _confirming_window(self, load: float) -> float | None:
        """The window of a confirming probe at `load`: `held_window_s`, from one window to
        `confirm_windows` of them; None when even that many could not show the SLO held (the search
        ends there: stepping further down would never close the interval)."""
        cfg = self.config
        needed = self.held_window_s(load)
        if needed is None:
            return None
        longest = cfg.confirm_windows * cfg.window_s
        return None if needed / CONFIRM_MARGIN > longest else min(longest, max(cfg.window_s, needed))

    def held_window_s(self, load: float) -> float | None:
        """The window in which a share with no failures at `load` would be shown held: the
        z² t / (1 - t) draws at which Wilson's lower bound for an all-good share reaches the target
        t, and CONFIRM_MARGIN more (a window that measured a little fewer requests than promised
        still decides), each draw worth the design effect times the dispersion in requests
        (loadgen/capacity/dispersion.py), at the rate the nearest probe measured scaled to `load`.
        Undecided probes whose failures come in bursts make a one-window share count as a handful
        of draws: then no one-window share at any load shows the SLO held. None before a probe ran."""
        cfg = self.config
        measured = [p for p in self.probes if p.window_s > 0 and p.share.total]
        if not measured:
            return None
        calibration = self.calibration()
        draws = CONFIRM_MARGIN * Z_95 ** 2 * cfg.target / (1 - cfg.target)
        requests = draws * calibration.design_effect * calibration.dispersion
        nearest = min(measured, key=lambda p: (abs(p.load - load), -p.load))  # a tie: the heavier, slower
        per_s = nearest.share.total / nearest.window_s * load / nearest.load
        return requests / per_s

    def observe(self, probe: Probe) -> None:
        confirming = self._confirming is not None and probe.load == self._confirming.load
        self.probes.append(replace(probe, confirming=True) if confirming else probe)
        self._looked = 0

    def calibration(self) -> Calibration:
        """The corrections the probes so far call for (loadgen/capacity/dispersion.py)."""
        return calibrate([p.load for p in self.probes], [p.share for p in self.probes], self.config.target)

    def _corrected(self, calibration: Calibration | None = None) -> list[Share]:
        """Each probe's share, its interval taken with the corrections (those of all probes so far
        unless given)."""
        calibration = self.calibration() if calibration is None else calibration
        return [calibration.share(p.share) for p in self.probes]

    def _bracket(self) -> tuple[float | None, float | None]:
        """(largest load that held below the smallest that failed, that smallest failure)."""
        target = self.config.target
        failed = [p.load for p in self.probes if not p.holds(target)]
        high = min(failed) if failed else None
        held = [p.load for p in self.probes if p.holds(target) and (high is None or p.load < high)]
        return (max(held) if held else None), high

    def _narrow(self, low: float, high: float) -> bool:
        cfg = self.config
        if cfg.integer:
            return high - low <= max(1, math.floor(cfg.resolution * low))
        return high <= low * (1 + cfg.resolution)

    def _middle(self, low: float, high: float) -> float:
        return float((int(low) + int(high)) // 2) if self.config.integer else math.sqrt(low * high)

    def _step_out(self, load: float, up: bool) -> float | None:
        """One bracket-width step beyond `load`, within [low, high]."""
        cfg = self.config
        lightest, heaviest = cfg.bounds
        if cfg.integer:
            step = max(1, math.floor(cfg.resolution * load))
            value = load + step if up else load - step
        else:
            value = load * (1 + cfg.resolution) if up else load / (1 + cfg.resolution)
        return self._clamp(value) if lightest <= value <= heaviest else None

    def _clamp(self, load: float) -> float:
        return float(max(1, round(load))) if self.config.integer else load

    # -- early stop -------------------------------------------------------------------------

    def early_verdict(self, sums: LiveSums, inflight: int, window_elapsed_s: float,
                      duration_s: float) -> str | None:
        """A reason to end the probe's window now, when its verdict is already decided. It is
        looked at once per `min_window_share` of the window (at 25, 50 and 75 % by default), at
        99 % each: a few looks at a strict level keep the early verdicts' error small, where a
        look at every progress poll would sooner or later stop on a lucky stretch."""
        cfg = self.config
        if not cfg.early_stop or cfg.over != "requests" or not duration_s:
            return None
        look = math.floor(window_elapsed_s / duration_s / cfg.min_window_share)
        if look <= self._looked or look * cfg.min_window_share >= 1:
            return None
        self._looked = look
        if sums.n < cfg.min_requests:
            return None
        total = sums.n + inflight
        # the in-flight ones at the same design effect; a window with no spread yet at the earlier probes'
        effective = self.calibration().effective(sums.share()) * total / sums.n
        low, _ = wilson(sums.g / total * effective, effective, Z_99)  # in flight counted as bad
        if low >= cfg.target:
            return f"decided after {window_elapsed_s:.0f} s: attainment at least {low:.1%} counting the " \
                   f"{inflight} in flight as bad"
        _, high = wilson((sums.g + inflight) / total * effective, effective, Z_99)  # ... and as good
        if high < cfg.target:
            return f"decided after {window_elapsed_s:.0f} s: attainment at most {high:.1%} counting the " \
                   f"{inflight} in flight as good"
        return None

    # -- the answer ---------------------------------------------------------------------------

    def result(self, gpus: int = 1) -> dict[str, Any]:
        """The capacity with its interval, per GPU, and the probes (results file's `capacity`)."""
        cfg = self.config
        probes = sorted(self.probes, key=lambda p: p.load)
        calibration = self.calibration()
        found = capacity_from_curve(probes, cfg.target, cfg.integer, calibration)
        per_gpu = {key: None if value is None else round(value / max(1, gpus), 4)
                   for key, value in found.items() if key in ("capacity", "low", "high")}
        # what an open low end would take: the window an all-good probe at the answer needs
        needs = self.held_window_s(found["capacity"]) if found["low"] is None and found["capacity"] else None
        return {
            "slo": {"name": cfg.slo.name, "spec": cfg.slo.text}, "target": cfg.target, "over": cfg.over,
            "resolution": cfg.resolution, "early_stop": cfg.early_stop,
            "mode": cfg.mode, "unit": UNITS[cfg.mode], **found, "gpus": gpus, "per_gpu": per_gpu,
            "window_s": cfg.window_s, "held_window_s": None if needs is None else round(needs, 1),
            "probes": [{"load": p.load, "label": p.label, "window_s": round(p.window_s, 3),
                        "stopped_early": p.stopped_early, "confirming": p.confirming, "holds": p.holds(cfg.target),
                        "verdict": corrected.verdict(cfg.target), **p.share.to_dict(),
                        "calibrated_interval": corrected.to_dict()["interval"]}
                       for p, corrected in zip(self.probes, self._corrected(calibration))],
        }


def capacity_from_curve(probes: Sequence[Probe], target: float, integer: bool,
                        calibration: Calibration | None = None) -> dict[str, Any]:
    """Point and interval of the capacity from the probes' shares and intervals, the intervals taken
    with the corrections their disagreement calls for (module docstring; loadgen/capacity/dispersion.py).

    `low` is None when no probe showed the SLO held, `high` when none showed it failed;
    `below_range`: even the lightest probe's share failed; `above_range`: even the heaviest held;
    `consistent`: false when, even so, a probe showed a load held that a lighter one showed failed
    (the interval is then the span between the two claims)."""
    usable = sorted((p for p in probes if p.share.value is not None and p.share.low is not None),
                    key=lambda p: p.load)
    if calibration is None:  # a search passes the one it took over the same probes
        calibration = calibrate([p.load for p in usable], [p.share for p in usable], target)
    if not usable:
        return {"capacity": None, "low": None, "high": None, "below_range": None, "above_range": None,
                "consistent": True, **calibration.to_dict()}
    shares = [calibration.share(p.share) for p in usable]
    loads = np.array([p.load for p in usable], dtype=np.float64)
    shown_held = np.maximum.accumulate(np.array([s.low for s in shares])[::-1])[::-1] >= target
    shown_failed = np.minimum.accumulate(np.array([s.high for s in shares])) < target
    low: float | None = float(loads[shown_held][-1]) if shown_held.any() else None
    high: float | None = None
    if shown_failed.any():
        failing = float(loads[shown_failed][0])
        high = failing - 1 if integer else failing
    if integer:
        low, high = (None if end is None else int(end) for end in (low, high))
    consistent = low is None or high is None or low <= high
    if not consistent:
        low, high = high, low
    weights = np.array([s.effective for s in shares], dtype=np.float64)
    curve = non_increasing(np.array([s.value for s in shares], dtype=np.float64), weights)
    point = _crossing(loads, curve, target)
    if point is not None:
        point = min(max(point, low if low is not None else point), high if high is not None else point)
        point = math.floor(point + 1e-9) if integer else round(point, 4)
    return {"capacity": point, "low": low, "high": high,
            "below_range": bool(curve[0] < target), "above_range": bool(curve[-1] >= target),
            "consistent": consistent, **calibration.to_dict()}


def _crossing(loads: np.ndarray, curve: np.ndarray, target: float) -> float | None:
    """The load where a non-increasing curve falls through `target`, interpolated linearly; None
    when it is under the target at the first load or still at or above it at the last."""
    if curve[0] < target or curve[-1] >= target:
        return None
    i = int(np.flatnonzero(curve >= target)[-1])
    x0, x1, y0, y1 = loads[i], loads[i + 1], curve[i], curve[i + 1]
    return float(x0 + (y0 - target) / (y0 - y1) * (x1 - x0))
