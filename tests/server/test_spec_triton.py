"""Speculative verification on the Triton kernels (CPU through TRITON_INTERPRET=1, the GPU code
path): greedy output with drafts accepted and rejected equals greedy output without drafts. The
interpreter must be on before triton is imported, hence a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # tens of seconds: scheduled first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import dataclasses, json, torch
    torch.set_num_threads(1)
    from server.config import SpeculativeConfig
    from server.engine.core import Engine
    from tests.server.engine_fixtures import greedy, prompt, run, tiny_config, tokens
    from tests.server.test_spec_decode import oracle_drafts

    # K = 32 covers every context here (at most 27 + 3 drafts): dense selection, see test_spec_decode.
    def config(spec):
        base = tiny_config(backend="triton", num_layers=1, num_heads=2, index_num_heads=1, index_topk=32,
                           num_blocks=8, max_num_batched_tokens=16)
        return dataclasses.replace(base, speculative=spec)

    reqs = {"x": (prompt(5, 19), greedy(8)), "y": (prompt(6, 7), greedy(8))}
    plain = tokens(run(Engine(config(None)), reqs))
    engine = Engine(config(SpeculativeConfig("mtp", 3, "standard")))
    oracle_drafts(engine, plain, 0.3)
    spec = tokens(run(engine, reqs))
    stats = engine.stats()
    print(json.dumps({"plain": plain, "spec": spec, "accepted": stats.spec_num_accepted_tokens,
                      "drafts": stats.spec_num_draft_tokens}))
""")


def test_triton_verification_keeps_greedy_output():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["spec"] == report["plain"]
    assert 0 < report["accepted"] < report["drafts"]
