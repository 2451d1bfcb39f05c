"""`loadgen compare` on results of the real replay pipeline against the test streaming server:
an A/A pair is within noise, a planted ~15 % per-token slowdown is worse beyond noise, gates set
the exit code, bad input exits 2 naming the file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from loadgen.cli import main
from loadgen.results.file import write_results

pytestmark = pytest.mark.slow  # tens of seconds: scheduled first (tests/conftest.py)

BASE_ITL_MS = 20.0  # long enough that timer and scheduling overheads are a small part of it
SLOW_ITL_MS = 23.0  # the planted slowdown: 3 ms (15 %) more per token
# TTFT long enough that a CI VM's scheduling jitter (a ms or so) stays well under the A/A tolerance: at 10 ms one
# run's TTFT p50 came out 8 % "worse" than its repeat.
FIRST_MS = 40.0
_RUNS: dict[str, Path] = {}  # the three runs are shared by the tests of this module


@pytest.fixture
def runs(start_server, sessions, replay, tmp_path_factory) -> dict[str, Path]:
    """base, base_again (A/A) and slow results files, each `--conc 4,8` for 5 s per level (window
    edges: one request more or less per lane is ±4 % of a level's throughput at 5 s)."""
    if _RUNS:
        return _RUNS
    folder = sessions(*({"n_requests": 2, "think": 0.0, "n_out": 6 + i % 8} for i in range(16)))
    out = tmp_path_factory.mktemp("compare")
    common = ("--traces", str(folder), "--conc", "4,8", "--seed", "3", "--start-offset", "0:0")
    base = start_server(first_ms=FIRST_MS, itl_ms=BASE_ITL_MS)
    slow = start_server(first_ms=FIRST_MS, itl_ms=SLOW_ITL_MS)
    # A discarded first run against each server: the first replay of a process ran cold (code paths, connections, the
    # servers' first requests), and twice on the CI VM the A/A pair's second run came out "better"
    # than the first beyond the 8 % tolerance (TTFT p50, throughput at conc 4).
    for server in (base, slow):
        assert replay(server.url, *common, "--duration", "1")[0] == 0
    for name, server in (("base", base), ("base_again", base), ("slow", slow)):
        code, doc, _ = replay(server.url, *common, "--duration", "5")
        assert code == 0
        _RUNS[name] = write_results(out / f"{name}.json", doc)
    return _RUNS


def _compare(capsys, *args: str) -> tuple[int, dict | str, str]:
    code = main(["compare", *map(str, args)])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if "--json" in args else out), err


def _by_metric(level: dict) -> dict[str, dict]:
    return {m["metric"]: m for m in level["metrics"]}


# Verdicts are asserted on medians and throughput: p90s over ~100 requests on a shared 2-core
# machine follow its scheduling jitter (a few ms on TTFT, hence on E2EL/OSL) as much as the server.
STEADY = ("ttft_p50", "tpot_p50", "interactivity_p50", "e2el_p50", "output_tput_per_gpu", "total_tput_per_gpu",
          "request_rate")
DECODE = ("tpot_p50", "interactivity_p50")


NOISE_PCT = 8  # drift between two runs on a shared 2-core machine; the planted slowdown is ~15 %


def test_an_a_a_pair_is_within_noise(runs, capsys):
    # Two runs in a row on a shared machine drift by a few % (scheduling, timers) that no
    # per-session bootstrap can see - only repeats can - hence --min-effect.
    code, doc, _ = _compare(capsys, runs["base"], runs["base_again"], "--json", "--min-effect", NOISE_PCT)
    assert code == 0
    assert [level["label"] for level in doc["levels"]] == ["conc 4", "conc 8"]
    for level in doc["levels"]:
        assert level["method"] == "paired sessions"
        metrics = _by_metric(level)
        assert len(metrics) == 15
        for name in STEADY:
            assert metrics[name]["verdict"] == "within noise", (level["label"], metrics[name])


def test_a_planted_slowdown_is_worse_beyond_noise(runs, capsys):
    code, doc, _ = _compare(capsys, runs["base"], runs["slow"], "--json")
    assert code == 0
    for level in doc["levels"]:
        metrics = _by_metric(level)
        for name in DECODE:
            low, high = metrics[name]["ci_pct"]
            assert metrics[name]["verdict"] == "worse", (level["label"], metrics[name])
            assert (high < 0) if metrics[name]["higher_is_better"] else (low > 0)
        assert metrics["tpot_p50"]["delta_pct"] > NOISE_PCT  # also beyond the A/A pair's tolerance
        for name in ("e2el_p90", "norm_e2el_p90", "tpot_p90"):
            assert metrics[name]["delta_pct"] > 0, (level["label"], metrics[name])
        assert metrics["e2e_interactivity"]["delta_pct"] < 0


def test_the_table_shows_values_deltas_intervals_and_verdicts(runs, capsys):
    code, out, _ = _compare(capsys, runs["base"], runs["slow"], "--metrics", "tpot_p50,e2el_p90")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("== conc 4:") and "paired over" in lines[0]
    tpot = next(line for line in lines if line.strip().startswith("TPOT p50"))
    assert "%" in tpot and tpot.rstrip().endswith("worse") and "[+" in tpot
    assert not any(line.strip().startswith("TTFT") for line in lines)  # --metrics chose two


@pytest.mark.parametrize("gate, expected", [
    ("tpot_p50:5", 1),  # ~15 % worse, beyond noise
    ("interactivity_p50:5", 1),  # higher is better: a drop is the regression
    ("tpot_p50:60", 0),  # worse, but not by more than 60 %
    ("ttft_p50:30", 0),  # TTFT did not change (beyond scheduling jitter)
])
def test_fail_on_regression_sets_the_exit_code(runs, capsys, gate, expected):
    args = (runs["base"], runs["slow"], "--fail-on-regression", gate, "--metrics", "e2el_p90")
    code, out, _ = _compare(capsys, *args)
    assert code == expected
    assert ("REGRESSION:" in out) == bool(expected)
    code, doc, _ = _compare(capsys, *args, "--json")
    assert code == expected and len(doc["regressions"]) >= expected
    # the gated metric is compared even when --metrics leaves it out
    assert [m["metric"] for m in doc["levels"][0]["metrics"]] == ["e2el_p90", gate.split(":")[0]]


def test_an_a_a_pair_passes_the_gate(runs, capsys):
    code, doc, _ = _compare(capsys, runs["base"], runs["base_again"], "--json", "--fail-on-regression",
                            f"tpot_p50:{NOISE_PCT}", "--fail-on-regression", f"e2el_p90:{NOISE_PCT}")
    assert code == 0 and doc["regressions"] == []


def test_same_seed_same_intervals(runs, capsys):
    first = _compare(capsys, runs["base"], runs["slow"], "--json", "--seed", "5", "--resamples", "300")[1]
    second = _compare(capsys, runs["base"], runs["slow"], "--json", "--seed", "5", "--resamples", "300")[1]
    assert first == second and first["resamples"] == 300


def test_repeats_on_both_sides(runs, capsys):
    code, doc, _ = _compare(capsys, f"{runs['base']},{runs['base_again']}", f"{runs['slow']},{runs['slow']}", "--json")
    assert code == 0
    assert all(level["method"] == "repeats" for level in doc["levels"])
    assert doc["base"] == [str(runs["base"]), str(runs["base_again"])]
    tpot = _by_metric(doc["levels"][0])["tpot_p50"]
    assert tpot["delta_pct"] > 0 and tpot["ci_pct"] is not None


def _error(capsys, *args) -> tuple[int, str]:
    code = main(["compare", *map(str, args)])
    return code, capsys.readouterr().err


def test_bad_input_exits_2_naming_the_problem(runs, capsys, tmp_path):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{nope")
    wrong_schema = tmp_path / "other.json"
    wrong_schema.write_text(json.dumps({"schema": "other/1", "levels": []}))
    other_levels = json.loads(Path(runs["base"]).read_text())
    for level in other_levels["levels"]:
        level["label"] = level["label"].replace("conc", "conc 1")
    relabelled = write_results(tmp_path / "relabelled.json", other_levels)
    cases = [
        ((tmp_path / "missing.json", runs["base"]), "missing.json: cannot read"),
        ((runs["base"], bad_json), "bad.json: not valid JSON"),
        ((wrong_schema, runs["base"]), "other.json: schema"),
        ((runs["base"], relabelled), "no common levels"),
        ((runs["base"], runs["slow"], "--metrics", "ttft_p42"), "unknown metric ttft_p42"),
        ((runs["base"], runs["slow"], "--fail-on-regression", "speed:5"), "unknown metric 'speed'"),
        ((runs["base"], runs["slow"], "--fail-on-regression", "tpot_p50"), "expected METRIC:PCT"),
        ((runs["base"], runs["slow"], "--resamples", "10"), "--resamples"),
        ((f"{runs['base']},{runs['base_again']}", runs["slow"]), "repeats needs at least 2 on each side"),
    ]
    for args, message in cases:
        code, err = _error(capsys, *args)
        assert code == 2, (args, err)
        assert message in err, (args, err)


def test_help_names_every_metric(capsys):
    from loadgen.results.metric_registry import STATISTICS

    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for metric in STATISTICS:
        stem, _, tail = metric.name.rpartition("_")
        assert metric.name in text or (tail.startswith("p") and f"{stem}_" in text and tail in text), metric.name


def test_replay_repeat_writes_one_entry_per_repeat_and_compare_uses_them(start_server, sessions, replay, tmp_path,
                                                                         capsys):
    """`--repeat 2` runs each level twice (same label, repeat 0 and 1); compare then resamples
    repeats, which see run-to-run drift that a per-session bootstrap cannot."""
    folder = sessions(*({"n_requests": 2, "think": 0.0, "n_out": 4} for _ in range(6)))
    server = start_server(first_ms=5, itl_ms=5)
    files = []
    for name in ("a", "b", "c"):
        code, doc, _ = replay(server.url, "--traces", str(folder), "--conc", "2", "--duration", "0.6",
                              "--repeat", "2", "--start-offset", "0:0")
        assert code == 0
        assert [(lv["label"], lv["repeat"]) for lv in doc["levels"]] == [("conc 2", 0), ("conc 2", 1)]
        files.append(write_results(tmp_path / f"{name}.json", doc))
    code, out, _ = _compare(capsys, files[0], files[1], "--json")
    assert code == 0
    assert [level["method"] for level in out["levels"]] == ["repeats"]
    # the repeats replayed the same plan: paired by repeat, percentiles over the requests both measured
    code, out, _ = _compare(capsys, files[0], files[1], "--json", "--paired")
    assert code == 0 and out["paired"]
    assert [level["method"] for level in out["levels"]] == ["paired rounds, matched requests"]
    # each round's own change is reported; the delta is their geometric mean
    tpot = next(m for m in out["levels"][0]["metrics"] if m["metric"] == "tpot_p50")
    rounds = tpot["rounds_pct"]
    assert len(rounds) == 2
    assert tpot["delta_pct"] == pytest.approx(100 * (math.sqrt((1 + rounds[0] / 100) * (1 + rounds[1] / 100)) - 1),
                                              abs=1e-4)
    code, text, _ = _compare(capsys, files[0], files[1], "--paired")
    row = next(line for line in text.splitlines() if line.strip().startswith("TPOT p50"))
    assert code == 0 and row.endswith(f" {rounds[0]:+.1f} {rounds[1]:+.1f}") and "per round, %" in text
    assert "base, new: matched requests, geometric mean over rounds" in text
    code, out, _ = _compare(capsys, files[0], files[1], "--json")
    assert all(m["rounds_pct"] is None for m in out["levels"][0]["metrics"])  # not paired: no rounds
    # a third variant's rounds join the residual variance; the delta is still NEW's against BASE
    code, out, _ = _compare(capsys, files[0], files[1], "--json", "--paired", "--block", files[2])
    assert code == 0 and out["block_variants"] == 1
    assert "residual variance over the rounds of 3 variants" in out["levels"][0]["detail"]
    assert _by_metric(out["levels"][0])["tpot_p50"]["delta_pct"] == pytest.approx(tpot["delta_pct"], abs=1e-4)
    code, _, err = _compare(capsys, files[0], files[1], "--block", files[2])
    assert code == 2 and "--block: other variants' rounds need --paired" in err


def test_repeat_must_be_positive(start_server, tmp_path, capsys):
    server = start_server()
    assert main(["replay", "--url", server.url, "--repeat", "0", "--out", str(tmp_path)]) == 2
    assert "--repeat: must be >= 1" in capsys.readouterr().err
