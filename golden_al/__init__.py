"""Golden acceptance-length curves and the package that reads them: lookup, per-position schedules, samplers."""

from golden_al.curves import Curve, CurveError, bundled_curves, list_curves, load_curve, read_curves, select_by_model
from golden_al.sampler import AcceptanceSampler
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
    "AcceptanceSampler",
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
