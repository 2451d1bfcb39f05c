"""Diagnostics of the server's processes (API, engine, tensor-parallel ranks) through `logging`.

Each process entry point calls `configure_logging` once: one stderr handler on the `server`
logger, level from AGENTLOAD_LOG_LEVEL (DEBUG, INFO, WARNING, ERROR; default INFO), which spawned
processes inherit through the environment. Library code only calls `logging.getLogger(__name__)`.
User-facing output (the `ready` line, CLI errors) stays plain text on stderr.
"""

from __future__ import annotations

import logging
import os
import sys

LOG_LEVEL_ENV = "AGENTLOAD_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_FORMAT = "%(levelname)s %(name)s: %(message)s"


def configure_logging() -> None:
    """Send the `server` package's records at or above AGENTLOAD_LOG_LEVEL to stderr (once per process)."""
    level = os.environ.get(LOG_LEVEL_ENV, "INFO").upper()
    if level not in LEVELS:
        raise ValueError(f"{LOG_LEVEL_ENV}: must be one of {', '.join(LEVELS)}, got {level!r}")
    logger = logging.getLogger("server")
    logger.setLevel(level)
    if not any(getattr(h, "agentload", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT))
        handler.agentload = True  # type: ignore[attr-defined]  # marks our handler: added once
        logger.addHandler(handler)
