"""Student's t distribution (two-sided p-values and quantiles) without SciPy.

The repeats test of loadgen/compare/significance.py needs t with few degrees of freedom (2-3
repeats per side give 1-4); a normal approximation there would be several times too narrow.
CDF by the regularized incomplete beta function (Lentz's continued fraction); quantile by
bisection on the CDF, which is monotone.
"""

from __future__ import annotations

import math

_EPS = 1e-14
_MAX_TERMS = 300


def two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for T ~ Student t with `df` degrees of freedom (df may be fractional)."""
    if math.isinf(t):
        return 0.0
    x = df / (df + t * t)
    return min(1.0, _betainc(df / 2.0, 0.5, x))


def quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, for p in (0.5, 1)."""
    low, high = 0.0, 1.0
    while two_sided_p(high, df) > 2.0 * (1.0 - p):
        high *= 2.0
    for _ in range(100):
        mid = 0.5 * (low + high)
        if two_sided_p(mid, df) > 2.0 * (1.0 - p):
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _continued_fraction(b, a, 1.0 - x) / b


def _continued_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, _MAX_TERMS):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h
