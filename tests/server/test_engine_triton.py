"""The engine on the Triton kernels (CPU through TRITON_INTERPRET=1) gives the torch backend's
results. The interpreter must be on before triton is imported, hence a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from server.config import EngineConfig

pytestmark = pytest.mark.slow  # tens of seconds: scheduled first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import json, torch
    from tests.server.engine_fixtures import greedy, prompt, run, tiny_config, tokens
    from tests.server.test_model import feed
    from server.engine.core import Engine
    from server.engine.model_runner import ModelRunner

    lists = {"A": list(prompt(3, 21)), "B": list(prompt(4, 9))}
    chunks = {"A": (12, 8, 1), "B": (8, 1)}
    report = {}
    for kv, key in (("bf16", "fp8"), ("fp8", "mxfp4")):
        logits = {}
        for backend in ("torch", "triton"):
            cfg = tiny_config(backend=backend, num_layers=1, index_topk=16, num_blocks=8,
                              kv_cache_dtype=kv, indexer_key_dtype=key)
            logits[backend] = torch.cat(list(feed(ModelRunner(cfg), lists, chunks)[0].values()))
        a, b = logits["torch"], logits["triton"]
        report[kv] = float((a - b).abs().max() / a.abs().max())
    reqs = {"x": (prompt(5, 19), greedy(3)), "y": (prompt(6, 7), greedy(3))}
    for backend in ("torch", "triton"):
        engine = Engine(tiny_config(backend=backend, num_layers=1, index_topk=16, num_blocks=8))
        report[backend] = tokens(run(engine, reqs))
    print(json.dumps(report))
""")


def test_triton_backend_matches_torch_backend():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["bf16"] < 1e-3 and report["fp8"] < 1e-3, report
    assert report["triton"] == report["torch"]


def test_triton_backend_on_cpu_needs_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        EngineConfig(device="cpu", attention_backend="triton")


def test_gluon_backend_needs_a_gpu_and_names_the_flag():
    """Gluon kernels do not run in the interpreter or on CPU: the flag is refused before the engine
    starts, by name (the GPU path is checked by benchmarks/gluon_sparse_mla.py on an sm_90 device)."""
    with pytest.raises(ValueError, match="--attention-backend gluon: needs --device cuda"):
        EngineConfig(device="cpu", attention_backend="gluon")


def test_gluon_is_a_server_flag_choice():
    proc = subprocess.run([sys.executable, "-m", "server.cli", "start", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0 and "gluon" in proc.stdout
