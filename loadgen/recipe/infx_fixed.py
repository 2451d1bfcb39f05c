"""Fixed-sequence scenarios of `recipe from-infx`: InferenceX's random-length requests as a trace file.

InferenceX's fixed-seq-len client (its benchmark_serving.py over the random dataset) draws each
request's input and output lengths uniformly from [RANGE_RATIO x L, L] (RANDOM_RANGE_RATIO, 0.8 in
its workflows), shares no prefix between requests, and sends conc x PROMPTS_PER_CONC prompts per
level. Here every prompt is one session of one request with lengths drawn the same way from a
seeded generator, no hash ids (no shared prefix) and no think time, written as a session-trace
JSONL file (traces/readers.py) for the recipe's workload.traces. The replay runs a window per level
instead of a prompt count; its closed loop starts a session afresh (a new salt) when one ends.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

RANGE_RATIO = 0.8
PROMPTS_PER_CONC = 10


def fixed_sessions(isl: int, osl: int, count: int, seed: int = 0) -> list[dict]:
    """`count` one-request sessions with lengths uniform on [RANGE_RATIO x L, L] (whole tokens)."""
    rng = np.random.default_rng(seed)
    inputs = rng.integers(int(RANGE_RATIO * isl), isl, size=count, endpoint=True)
    outputs = rng.integers(max(1, int(RANGE_RATIO * osl)), osl, size=count, endpoint=True)
    return [{"id": f"fixed-{i}", "requests": [{"t": 0.0, "in": int(n_in), "out": int(n_out)}]}
            for i, (n_in, n_out) in enumerate(zip(inputs, outputs))]


def write_fixed_trace(path: Path, isl: int, osl: int, max_conc: int, seed: int = 0) -> Path:
    """The trace file of one fixed-sequence search space: as many sessions as InferenceX sends
    prompts at the highest concurrency."""
    sessions = fixed_sessions(isl, osl, max_conc * PROMPTS_PER_CONC, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(session) + b"\n" for session in sessions))
    return path
