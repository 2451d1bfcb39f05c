"""`loadgen recipe run` on the tiny engine (real servers on 127.0.0.1): A/A pairs stay within the
documented false-verdict bound and a planted per-step delay is detected. A module of its own so
that the parallel test runner can give it a worker of its own (it is the suite's longest test)."""

from __future__ import annotations

import json
import uuid

import pytest

from loadgen.cli import main
from tests.loadgen.conftest import processes_with, write_recipe

pytestmark = pytest.mark.slow  # about two minutes: scheduled first (tests/conftest.py)

FALSE_VERDICT_BOUND = 0.05  # README "Calibration": A/A false verdicts per metric row


def test_a_a_on_the_tiny_engine_stays_within_the_bound_and_a_planted_delay_is_found(tmp_path, sessions):
    # Sessions of 8-20-token answers: a request's TPOT spans 7-19 gaps and a window holds several
    # requests even on the slow variant, so one busy moment of a shared CI core does not decide a
    # round's TPOT p50 (with the bundled sessions at token_scale 0.02, a round's p50 was two
    # requests of 3-4 tokens, and the planted 5x was once read as noise on 2 degrees of freedom).
    # Answer lengths differ between sessions, so E2EL p90 and its per-token forms are not one
    # number thrice. Two controls make 60 A/A rows: one chance cluster of correlated rows (a
    # run-level shift moves the E2EL family together) cannot pass for a 5 % rate by itself. Kept
    # servers: four server starts instead of sixteen, the rounds' own seeds. Four rounds of 1.5 s
    # windows: with three of 1 s (3-8 requests per window at conc 1), the 2-core VM's drifting
    # speed lined up with one variant's turns often enough that a whole family of rows (TPOT,
    # interactivity, E2EL of one control at conc 1) came out "better" or "worse" in 2 of 4 CI runs.
    folder = sessions(*({"n_requests": 40, "think": 0.0, "n_out": n_out} for n_out in (8, 12, 16, 20)))
    marker = f"tiny-{uuid.uuid4().hex}"
    doc = {"name": "aab", "server": {"kind": "ours", "startup_timeout_s": 300,
                                     "flags": {"model": "tiny", "device": "cpu", "served_model_name": marker}},
           "workload": {"traces": str(folder)},
           "sweep": {"conc": [1, 2], "duration_s": 1.5, "warmup": "1req", "repeats": 4, "seed": 7, "servers": "kept"},
           "variants": [{"name": "A"}, {"name": "A2", "control": True}, {"name": "A3", "control": True},
                        {"name": "slow", "flags": {"step_delay_ms": 60}}]}
    out = tmp_path / "out"
    assert main(["recipe", "run", str(write_recipe(tmp_path, doc)), "--out", str(out), "--quiet"]) == 0
    assert processes_with(marker) == []
    rows = []
    for control in ("A2", "A3"):
        aa = json.loads((out / "compare" / f"{control}-vs-A.json").read_text())
        assert all(level["method"] == "paired rounds, matched requests" for level in aa["levels"])
        rows += [(control, level["label"], m) for level in aa["levels"] for m in level["metrics"]]
    assert len(rows) == 60
    false = [(c, label, m["metric"], m["delta_pct"]) for c, label, m in rows if m["verdict"] in ("better", "worse")]
    assert len(false) / len(rows) <= FALSE_VERDICT_BOUND, false
    ab = json.loads((out / "compare" / "slow-vs-A.json").read_text())
    for level in ab["levels"]:
        tpot = next(m for m in level["metrics"] if m["metric"] == "tpot_p50")
        assert tpot["verdict"] == "worse", f"{level['label']}: {level['detail']}; {tpot}"
