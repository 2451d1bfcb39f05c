"""Agentic trace data and the package that reads it: schema, readers, prompt synthesis, scaling, statistics.

The names below are the package's public interface. The statistics and the prompt synthesis load
numpy, so their names load on first use: a module that needs only the schema, the readers or the
scaling settings (a CLI building its parser, the recipe schema) does not pay for numpy."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from traces.readers import DEFAULT_SET, bundled_sets, load_traces
from traces.scale import ScaleConfig, ScaleReport, scale_traces
from traces.schema import Request, Session, Subagent, TraceError, TraceSet

if TYPE_CHECKING:
    from traces.stats import Distribution, TraceStats, theoretical_hit_rate, trace_stats
    from traces.synth import PromptSynth

_ON_FIRST_USE = {"Distribution": "stats", "TraceStats": "stats", "theoretical_hit_rate": "stats",
                 "trace_stats": "stats", "PromptSynth": "synth"}

__all__ = [
    "DEFAULT_SET", "Distribution", "PromptSynth", "Request", "ScaleConfig", "ScaleReport", "Session", "Subagent",
    "TraceError", "TraceSet", "TraceStats", "bundled_sets", "load_traces", "scale_traces", "theoretical_hit_rate",
    "trace_stats",
]


def __getattr__(name: str) -> Any:
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module 'traces' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"traces.{module}"), name)
    globals()[name] = value
    return value
