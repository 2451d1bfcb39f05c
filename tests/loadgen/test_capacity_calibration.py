"""benchmarks/capacity_calibration.py --analyze on small synthetic folders: runs whose results
documents hold only a `capacity` block, laid out as a recipe writes them. Identical A and A2 give
no false verdict, and both a B at 60 % of A's capacity and the 15 % spike-in are found; an A2 half
again as large as A in every round is flagged wherever a draw keeps A as BASE in every round (the
analysis can fail); a round that one variant did not finish drops out. No timing asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def write_runs(folder: Path, capacities: dict[str, list[int]], unfinished: tuple[str, ...] = ()) -> None:
    for variant, values in capacities.items():
        for k, value in enumerate(values, start=1):
            run = folder / "runs-recipe" / "runs" / f"{variant}-r{k}"
            run.mkdir(parents=True)
            block = {"slo": {"name": "standard", "spec": "ttft<=5s,interactivity>=20"}, "unit": "agents",
                     "resolution": 0.1, "capacity": value, "low": value, "high": value + 1}
            status = "interrupted" if run.name in unfinished else "complete"
            (run / "result.json").write_text(json.dumps({"status": status, "capacity": block}))


def analyze(folder: Path) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "benchmarks/capacity_calibration.py", "--analyze", str(folder)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads((folder / "capacity_calibration.json").read_text()), done.stdout


def test_identical_runs_give_no_false_verdict_and_a_planted_loss_is_found(tmp_path):
    a = [10, 12, 10, 11, 9]
    write_runs(tmp_path, {"A": a, "A2": a, "B": [6, 7, 6, 7, 5]}, unfinished=("B-r5",))
    report, text = analyze(tmp_path)
    assert report["rounds"] == 4 and report["capacity"]["B"] == [6, 7, 6, 7]
    for design in ("paired", "block"):
        pooled = report["pooled"][design]
        # 4 rounds: 3 of them 4 ways with 4 assignments, all 4 with 8; B against A and A2 per subset
        assert (pooled["aa"], pooled["ab"]) == (4 * 4 + 8, 2 * 4 + 2)
        assert pooled["aa_false"] == 0 and pooled["ab_worse"] == pooled["ab"]
        assert pooled["spike_worse"] == pooled["aa"]  # NEW made exactly 15 % smaller on noiseless A/A pairs
    assert report["spread"]["rounds_a_equals_a2"] == 4
    assert -42 < report["planted_change_pct"]["B_vs_A_geometric"] < -38
    assert report["all_rounds"]["B vs A (block)"]["verdict"] == "worse"
    assert "B's change: -39.5 % against A" in text and "A/A false" in text


def test_a_consistent_aa_difference_is_flagged_where_the_draw_keeps_it(tmp_path):
    # A2 half again as large as A in every round: a false verdict in exactly the draws that keep A
    # as BASE in every round (4 subsets of 3 rounds, 1 of 4); mixed assignments cancel it
    write_runs(tmp_path, {"A": [10, 12, 10, 11], "A2": [15, 18, 15, 16], "B": [10, 12, 10, 11]})
    report, _ = analyze(tmp_path)
    for design in ("paired", "block"):
        pooled = report["pooled"][design]
        assert (pooled["aa_false"], pooled["aa"]) == (5, 24)
        assert (pooled["ab_worse"], pooled["ab"]) == (5, 10)  # B (= A) is worse than A2 only
    assert report["all_rounds"]["A2 vs A (paired)"]["verdict"] == "better"
