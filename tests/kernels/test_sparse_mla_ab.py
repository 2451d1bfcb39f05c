"""benchmarks/sparse_mla_ab.py runs end to end in its CPU smoke mode (no timing asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sparse_mla_ab", ROOT / "benchmarks" / "sparse_mla_ab.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sparse_mla_ab"] = module
    spec.loader.exec_module(module)
    return module


def test_ab_smoke_checks_both_sides(capsys):
    module = _load()
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


def test_ab_smoke_several_candidates_and_aa(capsys):
    """Each --config is a candidate of its own, --aa times the baseline as a second side, and every
    side is checked (a bitwise repeat included) and compared with the baseline."""
    module = _load()
    argv = ["--smoke", "--baseline", "kernels.sparse_mla", "--aa", "--config", "16,16,4,1", "--config",
            "16,32,4,2,0,2", "--repeats", "1"]
    assert module.main(argv) == 0
    out = capsys.readouterr().out
    for case in module.SMOKE_CASES:
        for side in ("baseline-again", "candidate1", "candidate2"):
            assert f"{case} {side}: SparseMlaConfig" in out
            assert f"{case}: median baseline" in out and f", {side} " in out
    assert "block_n=32, num_warps=4, num_stages=2, preload_tiles=0, programs_per_sm=2)" in out
    assert out.count("check ok") == out.count("bitwise repeat") == 2 * 4  # 2 cases x 4 sides
    assert "FAIL" not in out
