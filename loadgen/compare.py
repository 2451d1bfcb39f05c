"""A/B comparison of two runs, level by level, with bootstrap confidence intervals.

Sides. BASE and NEW are each one or more results files (`agentload.result/1`). Levels match by
label ("conc 4", "rate 2/s", "mooncake"). When a side holds one run of a level, the interval
comes from its requests; when it holds several runs of the same level - several files given
for that side, or the same label more than once in one file (`--repeat N`, or `--conc 4,4,4`)
- those are repeats and the interval comes from them.

Values. Every metric is computed from the level's per-request columns (`requests` in the
results file), so the value and its interval use one estimator: percentiles are nearest-rank
(the smallest value with at least q % of the requests at or below it); they can differ from the
HDR statistics of `loadgen report` by HDR's 0.1 % bucket width. Throughputs are tokens (or
requests) counted in the window / window seconds, per GPU where named so.

Interval of the delta. delta % = 100 (NEW - BASE) / BASE. Its 95 % interval is the 2.5-97.5 %
percentile range of the delta over bootstrap resamples:

- sessions (one run per side): the resampled unit is a session play (a session, or a recycled
  replay of it, with its subagents; all its requests move together). Plays match across runs
  by session id and order ("the 2nd play of session X in this level"). When at least half of
  all plays seen match (same traces and seed), the resample is paired: one draw of plays
  applies to both sides, so what the sessions themselves contribute cancels out in the delta
  (a play only one run measured - the slower run finishes fewer in its window - counts on that
  side only). Otherwise each side is resampled on its own.
- repeats (>= 2 runs of the level on each side): each side's value is the mean over its repeats;
  repeats are resampled with replacement on each side. Few repeats give a coarse interval; five
  or more are better.

A p99 over a few hundred requests is one of its largest few values: its interval is rough.

Verdict. "within noise" when the interval includes 0 (or |delta| is below `min_effect_pct`);
otherwise "better" or "worse" by the metric's direction: lower is better for latencies, higher
for throughput and interactivity. A per-session bootstrap sees the sessions' own variation,
not drift of the machine between two runs; repeats measure that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

CONFIDENCE = 0.95
PAIRED_MIN_OVERLAP = 0.5
CHUNK = 128  # resamples per block: bounds memory to CHUNK x requests weights per column


class CompareError(ValueError):
    """Runs that cannot be compared (no common level, repeats on one side only, ...)."""


@dataclass(frozen=True, slots=True)
class MetricDef:
    """One compared quantity. Percentiles read a request column; rates count it over the window."""

    name: str
    label: str
    unit: str
    higher_is_better: bool
    column: str
    q: float | None = None  # percentile; None for a rate
    inverse: bool = False  # shown value = scale / percentile (interactivity)
    scale: float = 1.0  # column unit -> shown unit
    per_gpu: bool = False


METRICS: tuple[MetricDef, ...] = (
    MetricDef("ttft_p50", "TTFT p50", "ms", False, "ttft_us", 50, scale=1e-3),
    MetricDef("ttft_p90", "TTFT p90", "ms", False, "ttft_us", 90, scale=1e-3),
    MetricDef("ttft_p99", "TTFT p99", "ms", False, "ttft_us", 99, scale=1e-3),
    MetricDef("tpot_p50", "TPOT p50", "ms", False, "tpot_us", 50, scale=1e-3),
    MetricDef("tpot_p90", "TPOT p90", "ms", False, "tpot_us", 90, scale=1e-3),
    MetricDef("interactivity_p50", "interactivity p50", "tok/s", True, "tpot_us", 50, inverse=True, scale=1e6),
    MetricDef("interactivity_p90", "interactivity p90 (slow tail)", "tok/s", True, "tpot_us", 90, inverse=True,
              scale=1e6),
    MetricDef("e2el_p50", "E2EL p50", "s", False, "e2el_us", 50, scale=1e-6),
    MetricDef("e2el_p90", "E2EL p90", "s", False, "e2el_us", 90, scale=1e-6),
    MetricDef("e2el_p99", "E2EL p99", "s", False, "e2el_us", 99, scale=1e-6),
    MetricDef("norm_e2el_p90", "E2EL/OSL p90", "ms/tok", False, "norm_e2el_us", 90, scale=1e-3),
    MetricDef("e2e_interactivity", "e2e interactivity", "tok/s", True, "norm_e2el_us", 90, inverse=True, scale=1e6),
    MetricDef("output_tput_per_gpu", "output tok/s per GPU", "tok/s", True, "osl", per_gpu=True),
    MetricDef("total_tput_per_gpu", "total tok/s per GPU", "tok/s", True, "tokens", per_gpu=True),
    MetricDef("request_rate", "requests/s", "req/s", True, "ones"),
)
METRIC_BY_NAME = {m.name: m for m in METRICS}


@dataclass(frozen=True)
class LevelSample:
    """The measured requests of one run of one level, as float columns (NaN where undefined)."""

    label: str
    source: str
    failed: bool
    plays: np.ndarray  # one key per request: "play id/session id"
    columns: dict[str, np.ndarray]
    window_s: float
    gpus: int

    @property
    def requests(self) -> int:
        return len(self.plays)


def level_sample(level: dict[str, Any], source: str) -> LevelSample:
    """Columns of a results-file level (`requests`, see results.py) ready for the bootstrap."""
    req = level["requests"]

    def col(name: str) -> np.ndarray:
        return np.array([np.nan if v is None else v for v in req[name]], dtype=np.float64)

    osl, isl, e2el = col("osl"), col("isl"), col("e2el_us")
    with np.errstate(divide="ignore", invalid="ignore"):
        norm = np.where(osl > 0, e2el / osl, np.nan)
    return LevelSample(
        label=level.get("label") or _label(level),
        source=source,
        failed=bool(level["failed"]),
        plays=play_keys(req["play"], req["session"]),
        columns={"ttft_us": col("ttft_us"), "tpot_us": col("tpot_us"), "e2el_us": e2el, "norm_e2el_us": norm,
                 "osl": osl, "tokens": isl + osl, "ones": np.ones_like(osl)},
        window_s=float(level["window_s"]),
        gpus=max(1, int((level.get("throughput") or {}).get("gpus") or 1)),
    )


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


def evaluate(sample: LevelSample, metrics: Sequence[MetricDef], counts: np.ndarray,
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


def point_values(sample: LevelSample, metrics: Sequence[MetricDef]) -> np.ndarray:
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


def session_bootstrap(base: LevelSample, new: LevelSample, metrics: Sequence[MetricDef], resamples: int,
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


def repeat_bootstrap(base: Sequence[LevelSample], new: Sequence[LevelSample], metrics: Sequence[MetricDef],
                     resamples: int, rng: np.random.Generator) -> Resampled:
    """Resample whole runs on each side; a side's value is the mean over its (resampled) repeats."""
    sides = []
    for runs in (base, new):
        values = np.stack([point_values(run, metrics) for run in runs], axis=1)
        picks = rng.integers(0, len(runs), size=(resamples, len(runs)))
        sides.append(values[:, picks].mean(axis=2))
    return Resampled(sides[0], sides[1], "repeats", f"{len(base)} vs {len(new)} repeats")


# -- comparison ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetricResult:
    metric: MetricDef
    base: float | None
    new: float | None
    delta_pct: float | None
    ci_pct: tuple[float, float] | None
    verdict: str

    @property
    def worse_by_pct(self) -> float | None:
        """How much worse NEW is, in % of BASE (negative when it is better)."""
        if self.delta_pct is None:
            return None
        return -self.delta_pct if self.metric.higher_is_better else self.delta_pct


@dataclass(frozen=True, slots=True)
class LevelComparison:
    label: str
    method: str
    detail: str
    base_requests: int
    new_requests: int
    base_failed: bool
    new_failed: bool
    results: tuple[MetricResult, ...]


@dataclass(frozen=True)
class Comparison:
    levels: tuple[LevelComparison, ...]
    only_base: tuple[str, ...]
    only_new: tuple[str, ...]
    resamples: int
    seed: int
    min_effect_pct: float


def group_levels(runs: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, list[LevelSample]]:
    """{label: its runs} over one side's results docs (source name, doc), in first-seen order."""
    groups: dict[str, list[LevelSample]] = {}
    for source, doc in runs:
        for level in doc["levels"]:
            sample = level_sample(level, source)
            groups.setdefault(sample.label, []).append(sample)
    return groups


def compare_runs(base: Sequence[tuple[str, dict[str, Any]]], new: Sequence[tuple[str, dict[str, Any]]],
                 metrics: Sequence[MetricDef] = METRICS, resamples: int = 2000, seed: int = 0,
                 min_effect_pct: float = 0.0) -> Comparison:
    """Compare every level the two sides share; raises CompareError when they share none."""
    if resamples < 100:
        raise CompareError(f"--resamples: need at least 100 for a 95 % interval, got {resamples}")
    base_groups, new_groups = group_levels(base), group_levels(new)
    common = [label for label in base_groups if label in new_groups]
    if not common:
        raise CompareError(f"no common levels: base has {_list(base_groups)}, new has {_list(new_groups)}")
    levels = []
    for number, label in enumerate(common):
        rng = np.random.default_rng([seed, number])
        levels.append(_compare_level(label, base_groups[label], new_groups[label], metrics, resamples, rng,
                                     min_effect_pct))
    return Comparison(
        levels=tuple(levels),
        only_base=tuple(label for label in base_groups if label not in new_groups),
        only_new=tuple(label for label in new_groups if label not in base_groups),
        resamples=resamples, seed=seed, min_effect_pct=min_effect_pct,
    )


def _compare_level(label: str, base: list[LevelSample], new: list[LevelSample], metrics: Sequence[MetricDef],
                   resamples: int, rng: np.random.Generator, min_effect_pct: float) -> LevelComparison:
    if len(base) == 1 and len(new) == 1:
        point_base, point_new = point_values(base[0], metrics), point_values(new[0], metrics)
        boot = session_bootstrap(base[0], new[0], metrics, resamples, rng)
    elif len(base) >= 2 and len(new) >= 2:
        point_base, point_new = (np.mean([point_values(r, metrics) for r in runs], axis=0) for runs in (base, new))
        boot = repeat_bootstrap(base, new, metrics, resamples, rng)
    else:
        raise CompareError(f"level {label!r}: base has {len(base)} run(s) and new has {len(new)}; a comparison "
                           f"over repeats needs at least 2 on each side (or exactly 1 on each side)")
    results = tuple(_metric_result(m, point_base[i], point_new[i], boot.base[i], boot.new[i], min_effect_pct)
                    for i, m in enumerate(metrics))
    return LevelComparison(label, boot.method, boot.detail, sum(r.requests for r in base),
                           sum(r.requests for r in new), any(r.failed for r in base), any(r.failed for r in new),
                           results)


def _metric_result(metric: MetricDef, base: float, new: float, boot_base: np.ndarray, boot_new: np.ndarray,
                   min_effect_pct: float) -> MetricResult:
    base_v, new_v = _finite(base), _finite(new)
    delta = 100.0 * (new_v - base_v) / base_v if base_v and new_v is not None else None
    with np.errstate(divide="ignore", invalid="ignore"):
        deltas = 100.0 * (boot_new - boot_base) / boot_base
    deltas = deltas[np.isfinite(deltas)]
    ci = None
    if delta is not None and deltas.size >= 0.5 * boot_base.size:
        tail = 100.0 * (1.0 - CONFIDENCE) / 2.0
        low, high = np.percentile(deltas, [tail, 100.0 - tail])
        ci = (float(low), float(high))
    return MetricResult(metric, base_v, new_v, delta, ci, verdict(metric, delta, ci, min_effect_pct))


def verdict(metric: MetricDef, delta_pct: float | None, ci_pct: tuple[float, float] | None,
            min_effect_pct: float = 0.0) -> str:
    """better / worse / within noise (the interval holds 0, or |delta| < min effect) / n/a."""
    if delta_pct is None or ci_pct is None:
        return "n/a"
    low, high = ci_pct
    if low <= 0.0 <= high or abs(delta_pct) < min_effect_pct:
        return "within noise"
    went_up = low > 0.0
    return "better" if went_up == metric.higher_is_better else "worse"


def _finite(value: float) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def _list(groups: dict[str, Any]) -> str:
    return ", ".join(groups) or "no levels"


# -- gates and output ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Gate:
    """--fail-on-regression METRIC:PCT: fail when NEW is worse by more than PCT % beyond noise."""

    metric: str
    pct: float


def regressions(comparison: Comparison, gates: Sequence[Gate]) -> list[dict[str, Any]]:
    """Every (level, metric) where a gate trips: verdict worse and worse by more than its PCT."""
    tripped = []
    for level in comparison.levels:
        for result in level.results:
            for gate in gates:
                if gate.metric != result.metric.name or result.verdict != "worse":
                    continue
                if result.worse_by_pct is not None and result.worse_by_pct > gate.pct:
                    tripped.append({"level": level.label, "metric": gate.metric, "threshold_pct": gate.pct,
                                    "delta_pct": result.delta_pct, "ci_pct": list(result.ci_pct)})
    return tripped


def to_json(comparison: Comparison, base_files: Sequence[str], new_files: Sequence[str],
            tripped: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "schema": "agentload.compare/1",
        "base": list(base_files), "new": list(new_files),
        "confidence": CONFIDENCE, "resamples": comparison.resamples, "seed": comparison.seed,
        "min_effect_pct": comparison.min_effect_pct,
        "levels": [{
            "label": level.label, "method": level.method, "detail": level.detail,
            "base_requests": level.base_requests, "new_requests": level.new_requests,
            "base_failed": level.base_failed, "new_failed": level.new_failed,
            "metrics": [{
                "metric": r.metric.name, "unit": r.metric.unit, "higher_is_better": r.metric.higher_is_better,
                "base": _round(r.base), "new": _round(r.new), "delta_pct": _round(r.delta_pct),
                "ci_pct": [_round(x) for x in r.ci_pct] if r.ci_pct else None, "verdict": r.verdict,
            } for r in level.results],
        } for level in comparison.levels],
        "only_in_base": list(comparison.only_base), "only_in_new": list(comparison.only_new),
        "regressions": list(tripped),
    }


def format_comparison(comparison: Comparison, tripped: Sequence[dict[str, Any]]) -> str:
    pct = int(CONFIDENCE * 100)
    lines = []
    for level in comparison.levels:
        flags = "".join(f" [{side} level FAILED]" for side, bad in (("base", level.base_failed),
                                                                    ("new", level.new_failed)) if bad)
        lines.append(f"== {level.label}: {level.base_requests} vs {level.new_requests} requests; "
                     f"{pct} % interval by bootstrap, {level.detail}{flags}")
        lines.append(f"   {'metric':<30}{'unit':>7}{'base':>11}{'new':>11}{'delta':>9}   {pct}% CI of delta"
                     f"{'':>5}verdict")
        for r in level.results:
            ci = f"[{r.ci_pct[0]:+.1f}, {r.ci_pct[1]:+.1f}] %" if r.ci_pct else "-"
            delta = f"{r.delta_pct:+.1f}%" if r.delta_pct is not None else "-"
            lines.append(f"   {r.metric.label:<30}{r.metric.unit:>7}{_num(r.base):>11}{_num(r.new):>11}"
                         f"{delta:>9}   {ci:<22}{r.verdict}")
    for side, labels in (("base", comparison.only_base), ("new", comparison.only_new)):
        if labels:
            lines.append(f"only in {side} (not compared): {', '.join(labels)}")
    lines.append("interactivity pX = 1 / pX(TPOT) (slow tail); e2e interactivity = 1 / p90(E2EL/OSL); "
                 "within noise: the interval includes 0"
                 + (f" or |delta| < {comparison.min_effect_pct:g} %" if comparison.min_effect_pct else ""))
    for trip in tripped:
        lines.append(f"REGRESSION: {trip['level']}: {trip['metric']} worse by {abs(trip['delta_pct']):.1f} % "
                     f"(> {trip['threshold_pct']:g} %, interval [{trip['ci_pct'][0]:+.1f}, "
                     f"{trip['ci_pct'][1]:+.1f}] %)")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if abs(value) >= 1000 else f"{value:.4g}"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
