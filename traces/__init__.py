"""Agentic trace data and the package that reads it: schema, readers, prompt synthesis, scaling, statistics."""

from traces.readers import DEFAULT_SET, bundled_sets, load_traces
from traces.scale import ScaleConfig, ScaleReport, scale_traces
from traces.schema import Request, Session, Subagent, TraceError, TraceSet
from traces.stats import Distribution, TraceStats, theoretical_hit_rate, trace_stats
from traces.synth import PromptSynth

__all__ = [
    "DEFAULT_SET",
    "Distribution",
    "PromptSynth",
    "Request",
    "ScaleConfig",
    "ScaleReport",
    "Session",
    "Subagent",
    "TraceError",
    "TraceSet",
    "TraceStats",
    "bundled_sets",
    "load_traces",
    "scale_traces",
    "theoretical_hit_rate",
    "trace_stats",
]
