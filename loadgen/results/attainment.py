"""What a level attains against an SLO (loadgen/results/slo.py): which requests were good, the share of
good requests and of good session plays with their intervals, goodput, and the bounds broken most.

A request is *good* when it completed and met every bound; a bound on TPOT or interactivity holds
for a request that has no TPOT (one output token, or all of them in one chunk: no decode interval
to judge). Failed requests (errors, timeouts, cancelled) are never good.

Attainment: the share of the level's counted requests that were good, and the share of its
session plays whose every counted request was good. Its interval (95 %) is Wilson's score
interval taken at an effective number of requests: the requests of one session play share a
context and a server state, so they are not independent draws. The variance of the share is
estimated with the plays as clusters (the ratio estimator's linearised variance, k / (k - 1)
sum_i (g_i - p n_i)^2 / N^2 over k plays with n_i requests, g_i good); the effective number is
p (1 - p) / variance, kept between the number of plays (every play one draw) and the number of
requests (no clustering). A level where every request or none was good shows no spread to
measure clustering with: it counts at the number of requests. Requests also share fate across
sessions: a long prefill, a preemption or a pause slows every stream in flight beside it, so
failures come in bursts in time that clustering by play does not see. The same estimate is
therefore also taken with blocks of start time as the clusters (a block spans the median E2EL,
rounded up to whole TIME_BLOCK_MIN_S: requests starting within one request's lifetime of each
other ran beside each other), and the interval is taken at the smaller of the two effective
numbers. A clustering with a single cluster measures no spread (a Mooncake trace is replayed as
one play): it yields to the other, and counts at one draw only when neither has two clusters. The capacity search's early stop judges a running level by the same rule (LiveSums).
Session attainment is Wilson's interval over the plays.

Goodput: good requests per second of window and their output tokens per second, per GPU too.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loadgen.results.slo import DEFAULT_TARGET, Bound, Slo

Z_95 = 1.959964  # two-sided 95 %
TIME_BLOCK_MIN_S = 0.5  # the shortest block of start time taken as one cluster


@dataclass(frozen=True, slots=True)
class Share:
    """A share of good units with its 95 % interval; `effective` is the number of independent
    draws the interval was taken at."""

    total: int
    good: int
    low: float | None
    high: float | None
    effective: float

    @property
    def value(self) -> float | None:
        return self.good / self.total if self.total else None

    def verdict(self, target: float) -> bool | None:
        """True when the whole interval is at or above `target`, False when below, else None."""
        if self.low is None or self.high is None:
            return None
        return True if self.low >= target else False if self.high < target else None

    def to_dict(self) -> dict[str, Any]:
        value = self.value
        return {"total": self.total, "good": self.good,
                "attainment": None if value is None else round(value, 6),
                "interval": None if self.low is None else [round(self.low, 6), round(self.high or 0.0, 6)],
                "effective_n": round(self.effective, 2)}


def wilson(good: float, n: float, z: float = Z_95) -> tuple[float, float]:
    """Wilson's score interval of a share `good / n` taken at `n` draws (n may be fractional)."""
    p = good / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True, slots=True)
class ClusterSums:
    """What the clustered interval needs of a set of plays (k plays, n_i requests, g_i good):
    sums that add across worker processes, as no play spans two workers."""

    plays: int = 0
    n: int = 0
    g: int = 0
    gg: float = 0.0
    gn: float = 0.0
    nn: float = 0.0

    @classmethod
    def of(cls, good: np.ndarray, total: np.ndarray) -> ClusterSums:
        g, n = good.astype(np.float64), total.astype(np.float64)
        return cls(int(len(n)), int(n.sum()), int(g.sum()), float(g @ g), float(g @ n), float(n @ n))

    def __add__(self, other: ClusterSums) -> ClusterSums:
        return ClusterSums(self.plays + other.plays, self.n + other.n, self.g + other.g, self.gg + other.gg,
                           self.gn + other.gn, self.nn + other.nn)

    def share(self, z: float = Z_95) -> Share:
        if self.n == 0:
            return Share(0, 0, None, None, 0.0)
        p = self.g / self.n
        effective = float(self.n)
        if 0 < p < 1:
            if self.plays < 2:
                effective = 1.0
            else:
                spread = self.gg - 2 * p * self.gn + p * p * self.nn  # sum_i (g_i - p n_i)^2
                variance = self.plays / (self.plays - 1) * max(spread, 0.0) / (self.n * self.n)
                effective = p * (1 - p) / variance if variance > 0 else float(self.n)
                effective = min(float(self.n), max(float(self.plays), effective))
        low, high = wilson(p * effective, effective, z)
        return Share(self.n, self.g, low, high, effective)


def play_share(plays_good: int, plays: int, z: float = Z_95) -> Share:
    """The share of whole plays that were all good: Wilson over the plays."""
    if plays == 0:
        return Share(0, 0, None, None, 0.0)
    low, high = wilson(plays_good, plays, z)
    return Share(plays, plays_good, low, high, float(plays))


# -- one level ------------------------------------------------------------------------------


def request_columns(requests: Mapping[str, Sequence]) -> dict[str, np.ndarray]:
    """The float columns the bounds read, from a level's `requests` (None -> NaN)."""

    def col(name: str) -> np.ndarray:
        return np.array([np.nan if v is None else v for v in requests.get(name, ())], dtype=np.float64)

    e2el, osl = col("e2el_us"), col("osl")
    with np.errstate(divide="ignore", invalid="ignore"):
        norm = np.where(osl > 0, e2el / osl, np.nan)
    return {"ttft_us": col("ttft_us"), "tpot_us": col("tpot_us"), "e2el_us": e2el, "norm_e2el_us": norm}


def bound_holds(bound: Bound, columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """Per request, whether the bound holds (NaN, an undefined TPOT, holds)."""
    values = columns[bound.column]
    if bound.op == ">=":  # interactivity, from TPOT
        with np.errstate(divide="ignore"):
            return ~(1e6 / values < bound.value)
    return ~(values > bound.value)


def good_mask(slo: Slo, columns: Mapping[str, np.ndarray]) -> tuple[np.ndarray, dict[str, int]]:
    """Per measured request whether it met every bound, and how many requests broke each bound."""
    count = len(columns["ttft_us"])
    good = np.ones(count, dtype=bool)
    broken = {}
    for bound in slo.bounds:
        holds = bound_holds(bound, columns)
        broken[bound.text] = int(count - holds.sum())
        good &= holds
    return good, broken


def level_attainment(slo: Slo, requests: Mapping[str, Sequence], error_plays: Sequence[int], window_s: float,
                     gpus: int, target: float = DEFAULT_TARGET) -> dict[str, Any]:
    """The `slo` entry of one level (README, "SLO, goodput and capacity"): attainment over its
    counted requests and plays with intervals, goodput, and the bounds broken most."""
    columns = request_columns(requests)
    good, broken = good_mask(slo, columns)
    plays = np.asarray(requests.get("play", ()), dtype=np.int64)
    errors = np.asarray(error_plays, dtype=np.int64)
    keys, index = np.unique(np.concatenate([plays, errors]), return_inverse=True)
    total = np.bincount(index, minlength=len(keys))
    good_per_play = np.bincount(index[: len(plays)], weights=good, minlength=len(keys))
    by_time = _time_clustered(requests.get("start_ms", ()), columns["e2el_us"], good, len(errors))
    requests_share = clustered_share(ClusterSums.of(good_per_play, total), by_time)
    sessions_share = play_share(int((good_per_play == total).sum()), len(keys))
    out_tokens = float(np.asarray(requests.get("osl", ()), dtype=np.float64)[good].sum()) if len(good) else 0.0
    per_s = (lambda x: round(x / window_s, 4)) if window_s > 0 else (lambda x: 0.0)
    violations = {**broken, "error": int(len(errors))}
    worst = max(violations, key=lambda k: violations[k]) if any(violations.values()) else None
    return {
        "name": slo.name, "spec": slo.text, "target": target,
        "requests": {**requests_share.to_dict(), "met": requests_share.verdict(target)},
        "sessions": sessions_share.to_dict(),
        "goodput": {"requests_per_s": per_s(int(good.sum())), "output_tokens_per_s": per_s(out_tokens),
                    "requests_per_s_per_gpu": per_s(int(good.sum()) / gpus),
                    "output_tokens_per_s_per_gpu": per_s(out_tokens / gpus)},
        "violations": violations,
        "worst": worst,
    }


def clustered_share(by_play: ClusterSums, by_time: ClusterSums | None, z: float = Z_95) -> Share:
    """The share at the smaller effective number of the two clusterings that have two clusters or more
    (module docstring); by play when neither has."""
    informative = [sums for sums in (by_play, by_time) if sums is not None and sums.plays >= 2] or [by_play]
    return min((sums.share(z) for sums in informative), key=lambda share: share.effective)


def _time_clustered(start_ms: Sequence[float], e2el_us: np.ndarray, good: np.ndarray,
                    errors: int) -> ClusterSums | None:
    """The requests clustered by blocks of start time (errors, which have no start time, one cluster
    of their own); None without start times."""
    start = np.asarray(start_ms, dtype=np.float64)
    if len(start) == 0 or len(start) != len(good):
        return None
    units = Counter(block_units(e2el_us).tolist())
    return _block_sums(start_blocks(start) // _lower_median(units), np.ones(len(good)), good.astype(np.float64),
                       errors)


def start_blocks(start_ms: np.ndarray) -> np.ndarray:
    """The TIME_BLOCK_MIN_S block each request started in."""
    return np.floor(start_ms / (TIME_BLOCK_MIN_S * 1e3)).astype(np.int64)


def block_units(e2el_us: np.ndarray) -> np.ndarray:
    """Per request, its E2EL in TIME_BLOCK_MIN_S blocks, rounded up (at least one; 0 without an E2EL).
    A time cluster spans the median request's: requests starting within one request's lifetime of
    each other ran beside each other."""
    with np.errstate(invalid="ignore"):
        units = np.ceil(e2el_us / (TIME_BLOCK_MIN_S * 1e6) - 1e-9)
    return np.where(np.isfinite(units), np.maximum(units, 1), 0).astype(np.int64)


def _lower_median(units: Counter) -> int:
    """The lower median of the requests' block units (those with an E2EL), at least one."""
    keys = sorted(k for k in units if k > 0)
    if not keys:
        return 1
    counts = np.cumsum([units[k] for k in keys])
    return int(keys[int(np.searchsorted(counts, (counts[-1] - 1) // 2, side="right"))])


def _block_sums(cluster: np.ndarray, total: np.ndarray, good: np.ndarray, errors: int) -> ClusterSums:
    """The sums over items (requests, or blocks of them) labelled by `cluster`, each with its
    requests and good ones; `errors` are one more cluster, all bad."""
    _, index = np.unique(cluster, return_inverse=True)
    n = np.bincount(index, weights=total)
    g = np.bincount(index, weights=good, minlength=len(n))
    if errors:
        n, g = np.append(n, errors), np.append(g, 0.0)
    return ClusterSums.of(g, n)


@dataclass(frozen=True, slots=True)
class LiveSums:
    """A running level's tally, in sums that add across worker processes: by play (no play spans
    two workers), and by TIME_BLOCK_MIN_S block of start time with a histogram of E2EL, from
    which the clusters in time are made as `level_attainment` makes them (workers share one
    window start, so their blocks line up)."""

    plays: ClusterSums = ClusterSums()
    block_requests: Counter = field(default_factory=Counter)  # block -> requests started in it
    block_good: Counter = field(default_factory=Counter)  # block -> good ones among them
    e2el_units: Counter = field(default_factory=Counter)  # E2EL in blocks (block_units) -> requests
    errors: int = 0

    @property
    def n(self) -> int:
        return self.plays.n

    @property
    def g(self) -> int:
        return self.plays.g

    def __add__(self, other: LiveSums) -> LiveSums:
        return LiveSums(self.plays + other.plays, self.block_requests + other.block_requests,
                        self.block_good + other.block_good, self.e2el_units + other.e2el_units,
                        self.errors + other.errors)

    def share(self, z: float = Z_95) -> Share:
        """The share as `level_attainment` takes it (`clustered_share`)."""
        if not self.block_requests:
            return clustered_share(self.plays, None, z)
        keys = np.fromiter(self.block_requests, dtype=np.int64, count=len(self.block_requests))
        requests = np.array([self.block_requests[k] for k in keys.tolist()], dtype=np.float64)
        good = np.array([self.block_good[k] for k in keys.tolist()], dtype=np.float64)
        by_time = _block_sums(keys // _lower_median(self.e2el_units), requests, good, self.errors)
        return clustered_share(self.plays, by_time, z)


class SloTally:
    """A running tally of one level's requests against one SLO, while it runs (the capacity
    search's early stop reads it); `sums` crosses process boundaries. Requests wait in lists and
    are judged in one vectorised pass when the sums are asked for."""

    def __init__(self, slo: Slo) -> None:
        self.slo = slo
        self._pending: dict[str, list] = {"play": [], "ttft_us": [], "e2el_us": [], "tpot_us": [], "osl": [],
                                          "start_ms": []}
        self._errors: list[int] = []
        self._play_requests: Counter = Counter()
        self._play_good: Counter = Counter()
        self._block_requests: Counter = Counter()  # TIME_BLOCK_MIN_S block of start -> requests
        self._block_good: Counter = Counter()
        self._e2el_units: Counter = Counter()
        self._error_count = 0

    def add(self, play: int, ttft_us: int, e2el_us: int, tpot_us: int | None, osl: int, start_ms: float) -> None:
        for name, value in zip(self._pending, (play, ttft_us, e2el_us, tpot_us, osl, start_ms)):
            self._pending[name].append(value)

    def add_error(self, play: int) -> None:
        self._errors.append(play)

    def sums(self) -> LiveSums:
        pending = self._pending
        if pending["play"]:
            columns = request_columns(pending)
            good, _ = good_mask(self.slo, columns)
            plays = np.asarray(pending["play"], dtype=np.int64)
            blocks = start_blocks(np.asarray(pending["start_ms"], dtype=np.float64))
            self._play_requests.update(plays.tolist())
            self._play_good.update(plays[good].tolist())
            self._block_requests.update(blocks.tolist())
            self._block_good.update(blocks[good].tolist())
            self._e2el_units.update(block_units(columns["e2el_us"]).tolist())
            for values in pending.values():
                values.clear()
        self._play_requests.update(self._errors)
        self._error_count += len(self._errors)
        self._errors.clear()
        if not self._play_requests:
            return LiveSums()
        keys = list(self._play_requests)
        by_play = ClusterSums.of(np.array([self._play_good[k] for k in keys]),
                                 np.array([self._play_requests[k] for k in keys]))
        return LiveSums(by_play, Counter(self._block_requests), Counter(self._block_good), Counter(self._e2el_units),
                        self._error_count)
