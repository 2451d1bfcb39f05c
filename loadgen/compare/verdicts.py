"""Interval, p-value and verdict of every (level, metric) of an A/B comparison.

Sides. BASE and NEW are each one or more results files (`agentload.result/1`). Levels match by
label ("conc 4", "rate 2/s", "mooncake"). When a side holds several runs of the same level -
several files for that side, or the same label more than once in one file (`--repeat N`,
`loadgen recipe run` with `repeats`) - those are repeats.

Columns. BASE and NEW, as the table shows them, are the values the delta is computed from:
delta % = 100 (NEW / BASE - 1). With repeats they are each side's geometric mean over its runs;
with paired rounds the geometric mean over the rounds of each round's values (matched requests,
below), over the rounds the test used; so NEW / BASE is exp(the mean log ratio), the centre of the
interval, and a paired delta is the geometric mean of the per-round ratios (`rounds_pct`, each
round's own change). One run per side: the run's own values. Matched columns are not the
percentiles over all requests that `loadgen report` shows, and can move the other way: the
slower run finishes fewer requests, and the ones it never finished are often the base run's
slowest. `LevelComparison.values` says which values the columns are.

Paired rounds (`paired`, a recipe's default; as many runs on each side): the k-th runs of the
two sides were measured together (round k of A B A B ..., the k-th `--repeat`), so what a round
shares - the machine's load and drift while its runs ran - cancels in their ratio. The test is
the one-sample t on the per-round log ratios (rounds - 1 degrees of freedom): the rounds are the
unit, so the run-level noise stays in the interval. Matched requests: two runs that replayed the
same plan measured mostly the same (session play, agent, turn) requests; then each percentile of
the round is taken over the requests both measured (stats.matched), so request-to-request
variation - which requests fell in each window; a slower run finishes fewer - drops out and the
ratio is the server's alone. Rates count whole windows. (A cluster bootstrap over so few rounds
would be far too narrow; benchmarks/ab_calibration.py counts the A/A false verdicts of a method.)

Block of variants (`blocks`: the other variants' runs of the same rounds, as a recipe with three
or more variants has them): the rounds are the blocks of a randomized complete block design. Each
round's log values of every variant, less the round's mean and the variant's mean, leave the
residuals, whose variance (rounds - 1) x (variants - 1) degrees of freedom estimate the run noise
that NEW - BASE carries; with two variants this is the paired t exactly. More variants, more
degrees of freedom, a narrower t: the same rounds find a smaller change.

Repeats (>= 2 runs of the level on each side): Welch's t-test on the logarithm of the per-run
values. Each run's value carries both the server's run-to-run variation (batching
interleavings, cache state, clocks, other load on the machine) and its own sampling noise, so
the between-run variance is the honest one; with 2-5 runs per side, the t distribution's few
degrees of freedom widen the interval as they must (a bootstrap of 3 runs would be several times
too narrow). Logs make a ratio symmetric and tame the skew of tail percentiles: a p99 over a few
hundred requests is one of a run's largest few values, and the spread of those values across runs
is exactly what its test should see.

A/A prior (`run_noise`: per metric, the run-to-run standard deviation of identical runs in % of
the value, and how many runs it came from, as benchmarks/ab_calibration.py measures it on the
same machine and workload): the runs' own variance and the prior are pooled, the prior counting
as (runs - 1) degrees of freedom (a moderated t-test). It is what makes a comparison with few
repeats, or a single run per side, account for run-to-run noise honestly; without repeats the
prior is all there is.

One run per side and no prior: the session bootstrap of loadgen/compare/stats.py, which cannot
see the run-to-run variation; the comparison is marked so (`run_to_run` false).

Verdict. Every comparison's p-values, over all its (level, metric) pairs, go through the
Benjamini-Hochberg procedure at false-discovery rate `fdr` (0.05): "better" or "worse" (by the
metric's direction) only when the change survives it and its 95 % interval excludes 0 (and
|delta| >= `min_effect_pct`); otherwise "within noise". Under no change at all this also bounds
the chance of any false verdict in the family by `fdr`. A row is only called better or worse
the way its columns moved (MetricResult raises otherwise): the t intervals hold their centre, and
a bootstrap's percentile interval that lies on the other side of 0 from its own estimate is no
evidence either way (within noise).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadgen.compare.significance import (
    benjamini_hochberg,
    block_log_test,
    bootstrap_test,
    complete_rounds,
    pooled_log_test,
    welch_log_test,
)
from loadgen.compare.stats import (
    PAIRED_MIN_OVERLAP,
    CompareError,
    LevelSample,
    group_levels,
    matched,
    point_values,
    session_bootstrap,
)
from loadgen.defaults import COMPARE
from loadgen.results.metric_registry import STATISTIC_BY_NAME, STATISTICS, Statistic


@dataclass(frozen=True, slots=True)
class MetricResult:
    metric: Statistic
    base: float | None
    new: float | None
    delta_pct: float | None
    ci_pct: tuple[float, float] | None
    verdict: str
    p_value: float | None = None
    rounds_pct: tuple[float | None, ...] = ()  # paired: NEW_k / BASE_k - 1 of every round k, in %

    def __post_init__(self) -> None:
        """A row is better or worse only the way its columns moved (lower is better for a latency,
        higher for a throughput): one that is not was built wrong, and would mislead its reader."""
        if self.verdict not in ("better", "worse") or self.base is None or self.new is None:
            return
        went_up = self.new > self.base
        if self.new == self.base or (went_up == self.metric.higher_is_better) != (self.verdict == "better"):
            moved = "above" if went_up else "below" if self.new < self.base else "equal to"
            raise ValueError(f"{self.metric.label}: NEW {self.new:.4g} {moved} BASE {self.base:.4g} but labelled "
                             f"{self.verdict} (delta {self.delta_pct}, interval {self.ci_pct})")

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
    values: str  # what the BASE and NEW columns are ("matched requests, geometric mean over rounds", ...)
    base_requests: int
    new_requests: int
    base_failed: bool
    new_failed: bool
    results: tuple[MetricResult, ...]
    run_to_run: bool = True  # whether the interval includes the run-to-run variation


@dataclass(frozen=True)
class Comparison:
    levels: tuple[LevelComparison, ...]
    only_base: tuple[str, ...]
    only_new: tuple[str, ...]
    resamples: int
    seed: int
    min_effect_pct: float
    fdr: float = COMPARE.fdr
    run_noise: RunNoise | None = None
    paired: bool = False
    blocks: int = 0  # other variants whose rounds joined the residual variance


@dataclass(frozen=True)
class RunNoise:
    """Run-to-run SD of identical runs, in % of each metric's value, measured over `runs` runs
    (None: taken as exact)."""

    sd_pct: Mapping[str, float]
    runs: int | None = None

    @property
    def prior_df(self) -> float:
        return 1e6 if self.runs is None else max(1, self.runs - 1)


def load_run_noise(text: str) -> RunNoise:
    """`--run-noise` / a recipe's compare.run_noise: a number (the SD in % of every metric, taken
    as exact) or a JSON file {"run_noise_pct": {metric: pct}, "runs": N} (benchmarks/ab_calibration.py)."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        if not value > 0:
            raise CompareError(f"--run-noise: must be > 0, got {text}")
        return RunNoise({name: value for name in STATISTIC_BY_NAME})
    try:
        with open(text, encoding="utf-8") as handle:
            doc = json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise CompareError(f"--run-noise: {text}: not a number and not a readable JSON file ({exc})") from None
    table, runs = (doc.get("run_noise_pct"), doc.get("runs")) if isinstance(doc, dict) else (None, None)
    if not isinstance(table, dict) or any(k not in STATISTIC_BY_NAME or not isinstance(v, (int, float)) or v <= 0
                                          for k, v in table.items()):
        raise CompareError(f"--run-noise: {text}: run_noise_pct: expected {{metric: pct > 0}} with known metrics")
    if runs is not None and (not isinstance(runs, int) or runs < 2):
        raise CompareError(f"--run-noise: {text}: runs: expected an integer >= 2, got {runs!r}")
    return RunNoise({k: float(v) for k, v in table.items()}, runs)


def compare_runs(base: Sequence[tuple[str, dict[str, Any]]], new: Sequence[tuple[str, dict[str, Any]]],
                 metrics: Sequence[Statistic] = STATISTICS, resamples: int = COMPARE.resamples,
                 seed: int = COMPARE.seed, min_effect_pct: float = COMPARE.min_effect_pct, fdr: float = COMPARE.fdr,
                 run_noise: RunNoise | None = None, paired: bool = False,
                 blocks: Sequence[Sequence[tuple[str, dict[str, Any]]]] = ()) -> Comparison:
    """Compare every level the two sides share; raises CompareError when they share none.
    `paired`: the k-th run of a level on each side belong together (round k of a recipe, the
    k-th `--repeat`). `blocks` (paired only): other variants' runs of the same rounds, whose
    residuals join the test's variance."""
    if resamples < 100:
        raise CompareError(f"--resamples: need at least 100 for a 95 % interval, got {resamples}")
    if not 0.0 < fdr < 1.0:
        raise CompareError(f"--fdr: must be in (0, 1), got {fdr:g}")
    if blocks and not paired:
        raise CompareError("--block: other variants' rounds need --paired (round k of every side measured together)")
    base_groups, new_groups = group_levels(base), group_levels(new)
    block_groups = [group_levels(runs) for runs in blocks]
    common = [label for label in base_groups if label in new_groups]
    if not common:
        raise CompareError(f"no common levels: base has {_list(base_groups)}, new has {_list(new_groups)}")
    estimates = []
    for number, label in enumerate(common):
        rng = np.random.default_rng([seed, number])
        others = [groups[label] for groups in block_groups if label in groups]
        estimates.append(_estimate_level(label, base_groups[label], new_groups[label], metrics, resamples, rng,
                                         run_noise, paired, others))
    significant = benjamini_hochberg([e.p_value for level in estimates for e in level[1]], fdr)
    levels, index = [], 0
    for header, results in estimates:
        judged = []
        for r in results:
            call = verdict(r.metric, r.delta_pct, r.ci_pct, min_effect_pct) if significant[index] else None
            judged.append(_with_verdict(r, call))
            index += 1
        levels.append(LevelComparison(**header, results=tuple(judged)))
    return Comparison(
        levels=tuple(levels),
        only_base=tuple(label for label in base_groups if label not in new_groups),
        only_new=tuple(label for label in new_groups if label not in base_groups),
        resamples=resamples, seed=seed, min_effect_pct=min_effect_pct, fdr=fdr, run_noise=run_noise, paired=paired,
        blocks=len(blocks),
    )


def _with_verdict(r: MetricResult, call: str | None) -> MetricResult:
    if call is None:
        call = "n/a" if r.delta_pct is None or r.ci_pct is None else "within noise"
    return dataclasses.replace(r, verdict=call)


def _estimate_level(label: str, base: list[LevelSample], new: list[LevelSample], metrics: Sequence[Statistic],
                    resamples: int, rng: np.random.Generator, run_noise: RunNoise | None, paired: bool,
                    others: Sequence[list[LevelSample]] = ()):
    """(LevelComparison fields but results, [MetricResult without verdict]) of one level."""
    rounds: list[tuple[float | None, ...]] = [() for _ in metrics]  # paired: each round's change, %
    if paired and run_noise is None and len(base) == len(new) >= 2:
        round_base, round_new, shares = round_values(base, new, metrics)
        ratios = _log_ratios(round_base, round_new)
        block = [round_log_ratios(base, other, metrics)[0] for other in others if len(other) == len(base)]
        used = [complete_rounds(ratios[i], [b[i] for b in block]) for i in range(len(metrics))]
        point_base = np.array([_geometric_mean(round_base[i, used[i]]) for i in range(len(metrics))])
        point_new = np.array([_geometric_mean(round_new[i, used[i]]) for i in range(len(metrics))])
        tests = [block_log_test(ratios[i], [b[i] for b in block]) for i in range(len(metrics))]
        rounds = [tuple(100.0 * math.expm1(x) if np.isfinite(x) else None for x in row) for row in ratios]
        method, run_to_run = ("paired rounds, matched requests" if shares else "paired rounds"), True
        values = ("matched requests, geometric mean over rounds (rates: whole windows; not `loadgen report`'s "
                  "percentiles over all requests)") if shares else "geometric mean over rounds"
        detail = f"{len(base)} rounds, t on the per-round ratios"
        if block:
            detail += f", residual variance over the rounds of {len(block) + 2} variants"
        if shares:
            detail += (f"; percentiles over the requests both runs of a round measured ({len(shares)} of "
                       f"{len(base)} rounds, {100 * min(shares):.0f}-{100 * max(shares):.0f} % of their requests)")
    elif len(base) == 1 and len(new) == 1 and run_noise is None:
        point_base, point_new = point_values(base[0], metrics), point_values(new[0], metrics)
        boot = session_bootstrap(base[0], new[0], metrics, resamples, rng)
        method, run_to_run, values = boot.method, False, "each run's own values, over all its requests"
        detail = boot.detail + "; single run per side, run-to-run noise NOT in the interval"
        tests = [bootstrap_test(point_base[i], point_new[i], boot.base[i], boot.new[i]) for i in range(len(metrics))]
    elif (len(base) >= 2 and len(new) >= 2) or run_noise is not None:
        per_base, per_new = _per_run(base, metrics), _per_run(new, metrics)
        # the log-scale means the t tests compare, so that NEW / BASE is their interval's centre
        point_base = np.array([_geometric_mean(row) for row in per_base])
        point_new = np.array([_geometric_mean(row) for row in per_new])
        single = len(base) == 1 and len(new) == 1
        method = "single run, A/A noise" if single else "repeats"
        values = "each run's own values, over all its requests" if single else "geometric mean over runs"
        detail, run_to_run = ("1 vs 1 run" if single else f"{len(base)} vs {len(new)} repeats"), True
        if run_noise is None:
            tests = [welch_log_test(per_base[i], per_new[i]) for i in range(len(metrics))]
        else:
            detail += f", pooled with the A/A run noise ({run_noise.runs or 'exact'} runs)"
            tests = [pooled_log_test(per_base[i], per_new[i], run_noise.sd_pct.get(m.name), run_noise.prior_df)
                     for i, m in enumerate(metrics)]
    else:
        raise CompareError(f"level {label!r}: base has {len(base)} run(s) and new has {len(new)}; a comparison "
                           f"over repeats needs at least 2 on each side (or exactly 1 on each side, or --run-noise)")
    results = []
    for i, metric in enumerate(metrics):
        base_v, new_v = _finite(point_base[i]), _finite(point_new[i])
        delta = 100.0 * (new_v / base_v - 1.0) if base_v and new_v is not None else None
        ci, p = tests[i] if delta is not None else (None, None)
        results.append(MetricResult(metric, base_v, new_v, delta, ci, "n/a", p if ci is not None else None,
                                    rounds[i]))
    header = {"label": label, "method": method, "detail": detail, "values": values,
              "base_requests": sum(r.requests for r in base),
              "new_requests": sum(r.requests for r in new), "base_failed": any(r.failed for r in base),
              "new_failed": any(r.failed for r in new), "run_to_run": run_to_run}
    return header, results


def _per_run(runs: Sequence[LevelSample], metrics: Sequence[Statistic]) -> np.ndarray:
    """(metrics, runs) values of every run."""
    return np.stack([point_values(r, metrics) for r in runs], axis=1)


def round_values(base: Sequence[LevelSample], new: Sequence[LevelSample],
                 metrics: Sequence[Statistic]) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """(metrics, rounds) values of BASE_k and of NEW_k, and the matched share of every matched
    round. A percentile is taken over the requests both runs of the round measured, when they
    share at least half of their requests (same plan): the two runs then differ by the server
    alone, not by which requests fell in their windows. Rates count whole windows."""
    values_base = np.full((len(metrics), len(base)), np.nan)
    values_new = np.full_like(values_base, np.nan)
    per_request = np.array([m.q is not None for m in metrics])
    shares = []
    for k, (b, n) in enumerate(zip(base, new)):
        value_b, value_n = point_values(b, metrics), point_values(n, metrics)
        cut = matched(b, n)
        if cut is not None and cut[2] >= PAIRED_MIN_OVERLAP:
            value_b = np.where(per_request, point_values(cut[0], metrics), value_b)
            value_n = np.where(per_request, point_values(cut[1], metrics), value_n)
            shares.append(cut[2])
        values_base[:, k], values_new[:, k] = value_b, value_n
    return values_base, values_new, shares


def round_log_ratios(base: Sequence[LevelSample], new: Sequence[LevelSample],
                     metrics: Sequence[Statistic]) -> tuple[np.ndarray, list[float]]:
    """(metrics, rounds) log(NEW_k / BASE_k) of round_values, and the matched shares."""
    values_base, values_new, shares = round_values(base, new, metrics)
    return _log_ratios(values_base, values_new), shares


def _log_ratios(base: np.ndarray, new: np.ndarray) -> np.ndarray:
    """log(new / base), not finite where either value is missing, zero or infinite."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(new / base)


def verdict(metric: Statistic, delta_pct: float | None, ci_pct: tuple[float, float] | None,
            min_effect_pct: float = COMPARE.min_effect_pct) -> str:
    """better / worse / within noise (the interval holds 0, or lies on the other side of 0 from
    the delta, or |delta| < min effect) / n/a."""
    if delta_pct is None or ci_pct is None:
        return "n/a"
    low, high = ci_pct
    if low <= 0.0 <= high or abs(delta_pct) < min_effect_pct:
        return "within noise"
    went_up = low > 0.0
    # a bootstrap's percentile interval need not hold its own estimate: the two disagreeing on
    # the direction is no evidence of either, and a verdict against the columns would mislead
    if not (delta_pct > 0.0 if went_up else delta_pct < 0.0):
        return "within noise"
    return "better" if went_up == metric.higher_is_better else "worse"


def _geometric_mean(values: np.ndarray) -> float:
    """exp(mean log) of the finite positive values (the ones the log-scale tests use); NaN if none."""
    kept = values[np.isfinite(values) & (values > 0)]
    return float(np.exp(np.log(kept).mean())) if kept.size else math.nan


def _finite(value: float) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def _list(groups: dict[str, Any]) -> str:
    return ", ".join(groups) or "no levels"


# -- gates -----------------------------------------------------------------------------------


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
                # "worse" always has an interval (verdict() says "n/a" without one)
                if result.worse_by_pct is not None and result.worse_by_pct > gate.pct and result.ci_pct is not None:
                    tripped.append({"level": level.label, "metric": gate.metric, "threshold_pct": gate.pct,
                                    "delta_pct": result.delta_pct, "ci_pct": list(result.ci_pct)})
    return tripped
