"""The measured side of `loadgen compare`: metric values of a level's requests, and the session
bootstrap of one run per side.

Values. Every metric is computed from the level's per-request columns (`requests` in the
results file), so the value and its interval use one estimator: percentiles are nearest-rank
(the smallest value with at least q % of the requests at or below it); they can differ from the
HDR statistics of `loadgen report` by HDR's 0.1 % bucket width. Throughputs are tokens (or
requests) counted in the window / window seconds, per GPU where named so.

Session bootstrap (one run per side): the resampled unit is a session play (a session, or a
recycled replay of it, with its subagents; all its requests move together). Plays match across
runs by session id and order ("the 2nd play of session X in this level"). When at least half of
all plays seen match (same traces and seed), the resample is paired: one draw of plays applies
to both sides, so what the sessions themselves contribute cancels out in the delta (a play only
one run measured - the slower run finishes fewer in its window - counts on that side only).
Otherwise each side is resampled on its own. It sees the sessions' variation, not the run-to-run
variation of the server; loadgen/compare/verdicts.py says how that is accounted for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from loadgen.results.metric_registry import Statistic

PAIRED_MIN_OVERLAP = 0.5
CHUNK = 128  # resamples per block: bounds memory to CHUNK x requests weights per column


class CompareError(ValueError):
    """Runs that cannot be compared (no common level, repeats on one side only, ...)."""


@dataclass(frozen=True)
class LevelSample:
    """The measured requests of one run of one level, as float columns (NaN where undefined)."""

    label: str
    source: str
    failed: bool
    plays: np.ndarray  # one key per request: "session#k", its play (play_keys)
    columns: dict[str, np.ndarray]
    window_s: float
    gpus: int
    keys: np.ndarray | None = None  # one key per request: "session#k/agent/turn" (request_keys)

    @property
    def requests(self) -> int:
        return len(self.plays)


def level_sample(level: dict[str, Any], source: str) -> LevelSample:
    """Columns of a results-file level (`requests`, see loadgen/results/file.py) ready for the bootstrap."""
    req = level["requests"]

    def col(name: str) -> np.ndarray:
        return np.array([np.nan if v is None else v for v in req[name]], dtype=np.float64)

    osl, isl, e2el = col("osl"), col("isl"), col("e2el_us")
    with np.errstate(divide="ignore", invalid="ignore"):
        norm = np.where(osl > 0, e2el / osl, np.nan)
    plays = play_keys(req["play"], req["session"])
    return LevelSample(
        label=level.get("label") or _label(level),
        source=source,
        failed=bool(level["failed"]),
        plays=plays,
        columns={"ttft_us": col("ttft_us"), "tpot_us": col("tpot_us"), "e2el_us": e2el, "norm_e2el_us": norm,
                 "osl": osl, "tokens": isl + osl, "ones": np.ones_like(osl)},
        window_s=float(level["window_s"]),
        gpus=max(1, int((level.get("throughput") or {}).get("gpus") or 1)),
        keys=request_keys(plays, req.get("agent") or [""] * len(plays), req["turn"]) if "turn" in req else None,
    )


def request_keys(plays: np.ndarray, agents: Sequence[str | None], turns: Sequence[int]) -> np.ndarray:
    """Per request, "session#k/agent/turn": the same request of the same play in any run that
    replayed the same plan (same traces and seed; a recipe's runs, `--repeat`'s repeats)."""
    return np.array([f"{p}/{a or ''}/{t}" for p, a, t in zip(plays, agents, turns)], dtype=object)


def matched(base: LevelSample, new: LevelSample) -> tuple[LevelSample, LevelSample, float] | None:
    """Both runs cut to the requests both measured (by request key), and the share of all their
    distinct requests that is; None when no request is in both."""
    if base.keys is None or new.keys is None:
        return None
    common = np.intersect1d(base.keys.astype(str), new.keys.astype(str))
    if not common.size:
        return None
    seen = np.union1d(base.keys.astype(str), new.keys.astype(str)).size
    return _subset(base, common), _subset(new, common), common.size / seen


def _subset(sample: LevelSample, keys: np.ndarray) -> LevelSample:
    """The sample's requests whose key is in `keys` (the first of any duplicate key)."""
    own = sample.keys.astype(str) if sample.keys is not None else np.array([], dtype=str)
    _, first = np.unique(own, return_index=True)
    keep = np.sort(first[np.isin(own[first], keys)])
    return replace(sample, plays=sample.plays[keep], keys=own[keep].astype(object),
                   columns={name: values[keep] for name, values in sample.columns.items()})


def play_keys(plays: Sequence[int], sessions: Sequence[str]) -> np.ndarray:
    """Per request, its play named as "session#k": the k-th play of that session in the level.

    Play ids depend on how many plays earlier levels used, which differs between a fast and a
    slow run; a session's k-th play in a level does not, so both runs' plays match by it.
    """
    ordinal: dict[int, str] = {}
    seen: dict[str, int] = {}
    for play, session in sorted(set(zip(plays, sessions))):
        ordinal[play] = f"{session}#{seen.get(session, 0)}"
        seen[session] = seen.get(session, 0) + 1
    return np.array([ordinal[p] for p in plays], dtype=object)


def _label(level: dict[str, Any]) -> str:
    if level.get("concurrency") is not None:
        return f"conc {level['concurrency']}"
    return f"rate {level['rate']:g}/s" if level.get("rate") is not None else str(level.get("mode"))


# -- statistics ------------------------------------------------------------------------------


def evaluate(sample: LevelSample, metrics: Sequence[Statistic], counts: np.ndarray,
             cluster: np.ndarray | None = None) -> np.ndarray:
    """Metric values (len(metrics), B) of the sample drawn with `counts` (B, clusters): request j
    weighs counts[:, cluster[j]] (without `cluster`, counts are per request). All ones is the
    sample itself. Weights are gathered once per column, already in value order."""
    cluster = np.arange(sample.requests) if cluster is None else cluster
    out = np.full((len(metrics), counts.shape[0]), np.nan)
    ranked: dict[str, RankedWeights] = {}
    for i, metric in enumerate(metrics):
        values = sample.columns[metric.column]
        if metric.q is None:
            if sample.window_s > 0:
                per = sample.window_s * (sample.gpus if metric.per_gpu else 1)
                out[i] = counts @ np.bincount(cluster, weights=values, minlength=counts.shape[1]) / per
            continue
        if metric.column not in ranked:
            valid = np.flatnonzero(~np.isnan(values))
            order = valid[np.argsort(values[valid], kind="stable")]
            ranked[metric.column] = RankedWeights(values[order], counts[:, cluster[order]])
        pct = ranked[metric.column].percentile(metric.q)
        with np.errstate(divide="ignore"):
            out[i] = metric.scale / pct if metric.inverse else pct * metric.scale
    return out


def point_values(sample: LevelSample, metrics: Sequence[Statistic]) -> np.ndarray:
    """The metrics of the sample itself (every request once), shape (len(metrics),)."""
    return evaluate(sample, metrics, np.ones((1, sample.requests), np.int32))[:, 0]


class RankedWeights:
    """Values in ascending order with per-row weights (B, n), ready for nearest-rank percentiles.

    The cumulative weights of all rows are laid end to end in one ascending array (row r shifted
    by r * span, span > any row's total), so one searchsorted answers every row at once.
    """

    def __init__(self, ordered: np.ndarray, weights: np.ndarray) -> None:
        self.ordered = ordered
        rows, self.n = weights.shape
        # int32 sums run several times faster than int64; a row's total is about its request count
        cum = np.cumsum(weights, axis=1, dtype=np.int32)
        self.total = cum[:, -1].astype(np.int64) if self.n else np.zeros(rows, np.int64)
        span = int(self.total.max(initial=0)) + 1
        self.shift = np.arange(rows, dtype=np.int64) * span
        if rows * span >= np.iinfo(np.int32).max:
            cum = cum.astype(np.int64)
        cum += self.shift[:, None].astype(cum.dtype)
        self.flat = cum.reshape(-1)

    def percentile(self, q: float) -> np.ndarray:
        """Per row, the smallest value with at least q % of the row's weight at or below it (NaN
        for a row with no weight)."""
        if self.n == 0:
            return np.full(len(self.total), np.nan)
        target = np.maximum(1, np.ceil(q / 100.0 * self.total - 1e-9)).astype(np.int64)
        pos = np.searchsorted(self.flat, target + self.shift, side="left")
        pos -= np.arange(len(self.total), dtype=np.int64) * self.n
        result = self.ordered[np.clip(pos, 0, self.n - 1)]
        result[self.total == 0] = np.nan
        return result


def cluster_counts(rng: np.random.Generator, clusters: int, rows: int) -> np.ndarray:
    """(rows, clusters) draw counts: each row draws `clusters` clusters with replacement."""
    draws = rng.integers(0, clusters, size=(rows, clusters)) + (np.arange(rows) * clusters)[:, None]
    counts = np.bincount(draws.ravel(), minlength=rows * clusters).reshape(rows, clusters)
    return counts.astype(np.int32)  # half the memory traffic of the per-request gathers


@dataclass(frozen=True, slots=True)
class Resampled:
    base: np.ndarray  # (metrics, resamples)
    new: np.ndarray
    method: str
    detail: str


def session_bootstrap(base: LevelSample, new: LevelSample, metrics: Sequence[Statistic], resamples: int,
                      rng: np.random.Generator) -> Resampled:
    """Resample session plays; paired (one draw for both sides) when they replayed the same plays."""
    if not base.requests or not new.requests:
        empty = np.full((len(metrics), resamples), np.nan)
        return Resampled(empty, empty, "sessions", "a run without measured requests")
    keys, inverse = np.unique(np.concatenate([base.plays, new.plays]).astype(str), return_inverse=True)
    base_idx, new_idx = inverse[: base.requests], inverse[base.requests:]
    in_base, in_new = np.unique(base_idx), np.unique(new_idx)
    common = np.intersect1d(in_base, in_new).size
    paired = common >= PAIRED_MIN_OVERLAP * len(keys) and common > 0
    # per side: cluster index of each request, compacted to the side's own clusters when unpaired
    local_base = np.searchsorted(in_base, base_idx)
    local_new = np.searchsorted(in_new, new_idx)
    out_base, out_new = [], []
    for start in range(0, resamples, CHUNK):
        rows = min(CHUNK, resamples - start)
        if paired:
            counts = cluster_counts(rng, len(keys), rows)
            out_base.append(evaluate(base, metrics, counts, base_idx))
            out_new.append(evaluate(new, metrics, counts, new_idx))
        else:
            out_base.append(evaluate(base, metrics, cluster_counts(rng, len(in_base), rows), local_base))
            out_new.append(evaluate(new, metrics, cluster_counts(rng, len(in_new), rows), local_new))
    if paired:
        detail = f"paired over {len(keys)} session plays ({common} in both runs)"
    else:
        detail = f"unpaired: {len(in_base)} vs {len(in_new)} session plays ({common} in both runs)"
    return Resampled(np.concatenate(out_base, axis=1), np.concatenate(out_new, axis=1),
                     "paired sessions" if paired else "sessions", detail)


def group_levels(runs: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, list[LevelSample]]:
    """{label: its runs} over one side's results docs (source name, doc), in first-seen order."""
    groups: dict[str, list[LevelSample]] = {}
    for source, doc in runs:
        for level in doc["levels"]:
            sample = level_sample(level, source)
            groups.setdefault(sample.label, []).append(sample)
    return groups
