"""benchmarks/engine.py runs end to end in its CPU smoke mode and prints its table (no timing asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "engine.py"


def test_engine_benchmark_smoke(capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("engine_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "engine_benchmark", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    assert module.main(["--smoke", "--kv-dtypes", "fp8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.startswith("tiny ")]
    assert [(r[1], r[2], r[3], r[4]) for r in rows] == [
        ("torch", "fp8", "decode", "1"), ("torch", "fp8", "decode", "8"), ("torch", "fp8", "prefill", "2")]
    assert all(float(r[6]) > 0 and float(r[8]) > 0 for r in rows)
