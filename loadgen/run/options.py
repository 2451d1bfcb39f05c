"""Defaults and flag parsing shared by `loadgen replay` and `loadgen bench`.

Kept free of heavy imports: cmd_replay.py reads the defaults here to build its parser, and the
replay (replay.py) parses the flag values with the helpers here, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

# `server start`'s default address (server/cli.py --host/--port; a test keeps the two equal).
# loadgen never imports the server package: it must run where torch is not installed.
LOCAL_SERVER_URL = "http://127.0.0.1:8000"
DEFAULT_FOREIGN_VOCAB = (1000, 30000)  # offset, size: clear of the low special ids many vocabularies use
OUR_VOCAB = (0, 256)  # our server's byte-level tokenizer: ids 0..255 are bytes, specials above


@dataclass(frozen=True, slots=True)
class ReplayDefaults:
    """Each replay default, once; argparse reads them from here."""

    url: str = LOCAL_SERVER_URL
    timeout_s: float = 600.0
    duration_s: float = 60.0
    warmup: str = "0s"
    warmup_timeout_s: float = 1800.0
    workers: str = "auto"
    progress_interval_s: float = 1.0  # in place on a terminal
    piped_progress_interval_s: float = 5.0  # one line each when stdout is not a terminal
    attainment: float = 0.95  # the share of good requests at which a level holds an SLO
    server_metrics_interval_s: float = 1.0  # /metrics scraped this often during a level (0: not at all)
    gpu_telemetry: str = "auto"  # where GPU power and energy are read (loadgen/telemetry/gpu.py)
    gpu_interval_s: float = 1.0  # GPU readings this often during a run


DEFAULTS = ReplayDefaults()


def parse_list(text: str, flag: str, kind: type) -> list:
    """'1,2,4' -> [1, 2, 4]; every item positive; ValueError naming the flag otherwise."""
    try:
        values = [kind(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"{flag}: expected positive numbers, got {text!r}")
    return values


def parse_offset(text: str) -> tuple[float, float]:
    try:
        low, high = (float(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"--start-offset: expected LO:HI like 0.25:0.75, got {text!r}") from None
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"--start-offset: need 0 <= LO <= HI <= 1, got {text!r}")
    return low, high


def parse_headers(items: list[str]) -> dict[str, str]:
    headers = {}
    for item in items:
        key, sep, value = item.partition(":")
        if not sep or not key.strip():
            raise ValueError(f"--header: expected K:V, got {item!r}")
        headers[key.strip()] = value.strip()
    return headers


def parse_workers(text: str) -> int | None:
    """'auto' -> None (sized to the load), else a positive count; ValueError naming --workers."""
    if text.strip().lower() == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"--workers: expected a positive number of processes or 'auto', got {text!r}")
    return value
