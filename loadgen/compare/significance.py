"""The tests of `loadgen compare` (loadgen/compare/verdicts.py says which one a level gets): on the
logs of per-run or per-round values, so a ratio is symmetric and the skew of tail percentiles is
tamed - Welch's t over repeats, the block (paired) t over rounds, the t pooled with an A/A prior -,
the percentile test of the session bootstrap, and the Benjamini-Hochberg procedure over a
comparison's p-values. Each test returns the 95 % interval of NEW/BASE - 1 in % and a two-sided p."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from loadgen.compare.student_t import quantile, two_sided_p

CONFIDENCE = 0.95


def complete_rounds(log_ratios: np.ndarray, other_log_ratios: Sequence[np.ndarray] = ()) -> np.ndarray:
    """Which rounds block_log_fit uses: those where NEW's and every other variant's ratio is finite."""
    return np.isfinite(np.vstack([log_ratios, *other_log_ratios])).all(axis=0)


def welch_log_test(base: np.ndarray, new: np.ndarray) -> tuple[tuple[float, float] | None, float | None]:
    """95 % interval of the ratio NEW/BASE - 1 in %, and the two-sided p-value, from Welch's t on
    the logs of the per-run values (each side needs >= 2 positive values)."""
    base, new = (np.log(v[np.isfinite(v) & (v > 0)]) for v in (base, new))
    if len(base) < 2 or len(new) < 2:
        return None, None
    diff = float(new.mean() - base.mean())
    var_base, var_new = base.var(ddof=1) / len(base), new.var(ddof=1) / len(new)
    se = math.sqrt(var_base + var_new)
    if se == 0.0:
        return t_test(diff, se, 1.0)
    df = se ** 4 / ((var_base ** 2 / (len(base) - 1) if var_base else 0.0)
                    + (var_new ** 2 / (len(new) - 1) if var_new else 0.0))
    return t_test(diff, se, df)


def block_log_test(log_ratios: np.ndarray, other_log_ratios: Sequence[np.ndarray] = ()
                   ) -> tuple[tuple[float, float] | None, float | None]:
    """95 % interval of NEW/BASE - 1 in % and the two-sided p, with the rounds as blocks: per round
    the log ratios of NEW and of every other variant to BASE (BASE's own is 0), residuals after the
    round and variant means, variance on (rounds - 1)(variants - 1) degrees of freedom. Rounds
    where any ratio is missing drop out. No other variants: the one-sample t on
    NEW's per-round log ratios (the paired t)."""
    fit = block_log_fit(log_ratios, other_log_ratios)
    if fit is None:
        return None, None
    diff, se, df, _ = fit
    return t_test(diff, se, df)


def block_log_fit(log_ratios: np.ndarray, other_log_ratios: Sequence[np.ndarray] = ()
                  ) -> tuple[float, float, float, int] | None:
    """block_log_test's (mean log ratio, its standard error, degrees of freedom, rounds used); None
    with fewer than two complete rounds."""
    table = np.vstack([np.zeros_like(log_ratios), log_ratios, *other_log_ratios])  # (variants, rounds)
    table = table[:, complete_rounds(log_ratios, other_log_ratios)]
    variants, n = table.shape
    if n < 2:
        return None
    residual = table - table.mean(axis=0) - table.mean(axis=1, keepdims=True) + table.mean()
    df = (n - 1) * (variants - 1)
    se = math.sqrt(2.0 * float((residual ** 2).sum()) / df / n)
    return float(table[1].mean()), se, df, n


def t_test(diff: float, se: float, df: float) -> tuple[tuple[float, float], float]:
    """The interval of exp(diff) - 1 in % and the two-sided p of a log difference with standard
    error `se` on `df` degrees of freedom."""
    if se == 0.0:
        pct = 100.0 * math.expm1(diff)
        return (pct, pct), (1.0 if diff == 0.0 else 0.0)
    half = quantile(0.5 + CONFIDENCE / 2.0, df) * se
    ci = (100.0 * math.expm1(diff - half), 100.0 * math.expm1(diff + half))
    return ci, two_sided_p(diff / se, df)


def pooled_log_test(base: np.ndarray, new: np.ndarray, prior_sd_pct: float | None,
                    prior_df: float) -> tuple[tuple[float, float] | None, float | None]:
    """Like welch_log_test, with one variance pooled over both sides' runs and the A/A prior
    (SD of log values = prior_sd_pct / 100, worth prior_df degrees of freedom); works from one run
    per side. A metric without a prior falls back to Welch."""
    if prior_sd_pct is None:
        return welch_log_test(base, new)
    base, new = (np.log(v[np.isfinite(v) & (v > 0)]) for v in (base, new))
    if not len(base) or not len(new):
        return None, None
    diff = float(new.mean() - base.mean())
    squares = float(((base - base.mean()) ** 2).sum() + ((new - new.mean()) ** 2).sum())
    df = len(base) + len(new) - 2 + prior_df
    variance = (squares + prior_df * (prior_sd_pct / 100.0) ** 2) / df
    return t_test(diff, math.sqrt(variance * (1.0 / len(base) + 1.0 / len(new))), df)


def bootstrap_test(base: float, new: float, boot_base: np.ndarray,
                    boot_new: np.ndarray) -> tuple[tuple[float, float] | None, float | None]:
    """Percentile interval of delta % over the session bootstrap, and its two-sided p-value."""
    with np.errstate(divide="ignore", invalid="ignore"):
        deltas = 100.0 * (boot_new - boot_base) / boot_base
    deltas = deltas[np.isfinite(deltas)]
    if not (math.isfinite(base) and math.isfinite(new)) or deltas.size < 0.5 * boot_base.size:
        return None, None
    tail = 100.0 * (1.0 - CONFIDENCE) / 2.0
    low, high = np.percentile(deltas, [tail, 100.0 - tail])
    below, above = int((deltas <= 0).sum()), int((deltas >= 0).sum())
    return (float(low), float(high)), min(1.0, 2.0 * (min(below, above) + 1) / (deltas.size + 1))


def benjamini_hochberg(p_values: Sequence[float | None], fdr: float) -> list[bool]:
    """Which hypotheses the Benjamini-Hochberg step-up procedure rejects at `fdr` (None: untested)."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    keep = [False] * len(p_values)
    cutoff = 0
    for rank, (p, _) in enumerate(tested, start=1):
        if p <= fdr * rank / len(tested):
            cutoff = rank
    for _, i in tested[:cutoff]:
        keep[i] = True
    return keep
