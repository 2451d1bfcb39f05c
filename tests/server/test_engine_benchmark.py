"""benchmarks/engine.py runs end to end in its CPU smoke mode and prints its table (no timing asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "engine.py"


def load_script(monkeypatch):
    spec = importlib.util.spec_from_file_location("engine_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "engine_benchmark", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_engine_benchmark_smoke(capsys, monkeypatch):
    module = load_script(monkeypatch)
    assert module.main(["--smoke", "--kv-dtypes", "fp8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.startswith("tiny ")]
    assert [(r[1], r[2], r[3], r[4]) for r in rows] == [
        ("torch", "fp8", "decode", "1"), ("torch", "fp8", "decode", "8"), ("torch", "fp8", "prefill", "2")]
    assert all(float(r[6]) > 0 and float(r[8]) > 0 for r in rows)


def test_engine_benchmark_speculative_steps(capsys, monkeypatch):
    # Verify steps of 3 drafts at a synthetic AL of 4 (every draft accepted): 4 tokens a request a
    # step, overlapped or not.
    module = load_script(monkeypatch)
    assert module.main(["--smoke", "--kv-dtypes", "bf16", "--no-prefill", "--speculative", "3",
                        "--acceptance-length", "4", "--overlap", "on,off"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("tiny ")]
    assert sorted((r[3], r[4], r[11]) for r in rows) == [
        ("verify3", "1", "off"), ("verify3", "1", "on"), ("verify3", "8", "off"), ("verify3", "8", "on")]
    for r in rows:  # tok/s x step time = tokens a step
        assert float(r[7]) * float(r[6]) / 1e3 == pytest.approx(int(r[4]) * 4, rel=1e-3)
