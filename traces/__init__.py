"""Agentic trace data and the package that reads it: schema, readers, prompt synthesis, scaling, statistics."""
