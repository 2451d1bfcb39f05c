"""benchmarks/sparse_mla_ab.py runs end to end in its CPU smoke mode (no timing asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ab_smoke_checks_both_sides(capsys):
    spec = importlib.util.spec_from_file_location("sparse_mla_ab", ROOT / "benchmarks" / "sparse_mla_ab.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sparse_mla_ab"] = module
    spec.loader.exec_module(module)
    # the baseline may be any module with the launcher's interface: here this tree's own kernel
    argv = ["--smoke", "--baseline", "kernels.sparse_mla", "--config", "16,16,4,1,2", "--repeats", "1"]
    assert module.main(argv) == 0
    out = capsys.readouterr().out
    for case in module.SMOKE_CASES:
        for side in ("baseline", "candidate"):
            assert f"{case} {side}: SparseMlaConfig" in out and "check ok" in out
        assert f"{case}: median baseline" in out
    assert "FAIL" not in out
    assert "preload_tiles=2" in out  # the candidate's --config reached its launch
