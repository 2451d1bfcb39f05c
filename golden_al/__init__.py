"""Golden acceptance-length curves and the package that reads them: lookup, per-position schedules, samplers."""
