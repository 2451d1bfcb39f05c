"""Each default of a replay, once: the one dataclass `loadgen replay`, `bench` and `capacity` read
for their flags, and the run's own settings (loadgen/run/level.py's RunConfig), the transports and
the SLOs read for theirs; and a comparison's, which `loadgen compare`, recipes and the verdicts read.
Kept free of imports, so the CLI builds its parser without loading the run or numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

# `server start`'s default address (server/cli.py --host/--port; a test keeps the two equal).
# loadgen never imports the server package: it must run where torch is not installed.
LOCAL_SERVER_URL = "http://127.0.0.1:8000"
DEFAULT_FOREIGN_VOCAB = (1000, 30000)  # offset, size: clear of the low special ids many vocabularies use
ENDPOINTS = ("completions", "chat")  # the OpenAI-compatible endpoints a replay can target
OUR_VOCAB = (0, 256)  # our server's byte-level tokenizer: ids 0..255 are bytes, specials above


@dataclass(frozen=True, slots=True)
class ReplayDefaults:
    """Each replay default, once; argparse reads them from here."""

    url: str = LOCAL_SERVER_URL
    endpoint: str = "completions"
    timeout_s: float = 600.0
    conc: str = "1"
    repeat: int = 1
    duration_s: float = 60.0
    warmup: str = "0s"
    warmup_timeout_s: float = 1800.0
    start_offset: tuple[float, float] = (0.25, 0.75)  # a lane's first play starts in this share of its requests
    time_scale: float = 1.0  # Mooncake timestamps multiplied by this
    seed: int = 0
    max_error_rate: float = 0.10  # a level with a larger share of failed requests is failed
    workers: str = "auto"
    progress_interval_s: float = 1.0  # in place on a terminal
    piped_progress_interval_s: float = 5.0  # one line each when stdout is not a terminal
    attainment: float = 0.95  # the share of good requests at which a level holds an SLO
    server_metrics_interval_s: float = 1.0  # /metrics scraped this often during a level (0: not at all)
    gpu_telemetry: str = "auto"  # where GPU power and energy are read (loadgen/telemetry/gpu.py)
    gpu_interval_s: float = 1.0  # GPU readings this often during a run


DEFAULTS = ReplayDefaults()


@dataclass(frozen=True, slots=True)
class CompareDefaults:
    """Each default of a comparison's verdicts (loadgen/compare/verdicts.py), once."""

    fdr: float = 0.05  # Benjamini-Hochberg's false-discovery rate over all (level, metric) rows
    resamples: int = 2000  # bootstrap resamples per (level, metric) row
    seed: int = 0  # the bootstrap's
    min_effect_pct: float = 0.0  # a smaller |delta| is within noise


COMPARE = CompareDefaults()
