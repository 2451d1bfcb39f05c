"""benchmarks/spec_decode.py runs end to end in its CPU smoke mode and prints its table (no timing asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "spec_decode.py"


def load(monkeypatch):
    spec = importlib.util.spec_from_file_location("spec_decode_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "spec_decode_benchmark", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_spec_decode_benchmark_smoke(capsys, monkeypatch):
    assert load(monkeypatch).main(["--smoke"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.startswith(("off ", "mtp "))]
    assert [(r[0], r[-6]) for r in rows] == [("off", "1"), ("off", "2"), ("mtp", "1"), ("mtp", "2")]
    for r in rows:
        al, per_request, per_gpu = float(r[-5]), float(r[-3]), float(r[-2])
        assert per_request > 0 and per_gpu > 0
        assert al == 1.0 if r[0] == "off" else 1.0 < al <= 6.0


def test_spec_decode_benchmark_refuses_bad_al(capsys, monkeypatch):
    assert load(monkeypatch).main(["--smoke", "--al", "7"]) == 2
    assert "synthetic_acceptance_length" in capsys.readouterr().err
