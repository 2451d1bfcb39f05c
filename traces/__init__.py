"""Agentic trace data and the package that reads it: schema, readers, prompt synthesis, scaling, statistics."""

from traces.readers import DEFAULT_SET, bundled_sets, load_traces
from traces.schema import Request, Session, Subagent, TraceError, TraceSet
from traces.synth import PromptSynth

__all__ = [
    "DEFAULT_SET",
    "PromptSynth",
    "Request",
    "Session",
    "Subagent",
    "TraceError",
    "TraceSet",
    "bundled_sets",
    "load_traces",
]
