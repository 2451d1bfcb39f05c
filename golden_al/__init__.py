"""Golden acceptance-length curves and the package that reads them: lookup and per-position schedules.
The sampler (golden_al/sampler.py, numpy) is imported from its module, so that reading the curves
stays light (the CLIs' help and the engine's flag definitions import this package)."""

from golden_al.curves import Curve, CurveError, bundled_curves, list_curves, load_curve, read_curves, select_by_model
from golden_al.schedules import (
    SCHEDULES,
    conditional_to_unconditional,
    geometric_rates,
    min_variance_rates,
    schedule_rates,
    unconditional_to_conditional,
    validate_rates,
)

__all__ = [
    "SCHEDULES",
    "Curve",
    "CurveError",
    "bundled_curves",
    "conditional_to_unconditional",
    "geometric_rates",
    "list_curves",
    "load_curve",
    "min_variance_rates",
    "read_curves",
    "schedule_rates",
    "select_by_model",
    "unconditional_to_conditional",
    "validate_rates",
]
