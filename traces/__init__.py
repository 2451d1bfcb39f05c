"""Agentic trace data and the package that reads it: schema, readers, prompt synthesis, scaling, statistics.

The names below are the package's public interface. They load on first use, so a module that needs
only the schema or the scaling settings (a CLI building its parser, the recipe schema) does not load
numpy with the statistics and the prompt synthesis."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from traces.readers import DEFAULT_SET, bundled_sets, load_traces
    from traces.scale import ScaleConfig, ScaleReport, scale_traces
    from traces.schema import Request, Session, Subagent, TraceError, TraceSet
    from traces.stats import Distribution, TraceStats, theoretical_hit_rate, trace_stats
    from traces.synth import PromptSynth

__all__ = [
    "DEFAULT_SET", "Distribution", "PromptSynth", "Request", "ScaleConfig", "ScaleReport", "Session", "Subagent",
    "TraceError", "TraceSet", "TraceStats", "bundled_sets", "load_traces", "scale_traces", "theoretical_hit_rate",
    "trace_stats",
]
_MODULES = ("schema", "scale", "readers", "synth", "stats")  # the cheap ones first


def __getattr__(name: str) -> Any:
    if name in __all__:
        for module in _MODULES:
            value = getattr(importlib.import_module(f"traces.{module}"), name, None)
            if value is not None:
                globals()[name] = value
                return value
    raise AttributeError(f"module 'traces' has no attribute {name!r}")
