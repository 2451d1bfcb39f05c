"""AgentX submission validity (loadgen/run/validity.py): a real replay run with the submission flags
passes every rule (its window shortened); each rule fails, named, when its input breaks it; a
results file lacking keys is invalid with the rules it cannot check; the submission flags parse
with the replay parser."""

from __future__ import annotations

import copy
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

from loadgen.cli import build_parser
from loadgen.run.validity import SUBMISSION, check_validity, submission_flags

# the preset's rules with a window a test can afford; everything else as AgentX asks
SHORT = replace(SUBMISSION, min_window_s=0.4)
_RUN: dict[str, dict] = {}


def _argv(flags: dict[str, Any]) -> list[str]:
    return [item for dest, value in flags.items() for item in (f"--{dest.replace('_', '-')}", str(value))]


@pytest.fixture
def run_doc(start_server, sessions, replay) -> dict:
    """A real closed-loop run (2 lanes) with the submission flags, its window 0.5 s; run once per module."""
    if not _RUN:
        server = start_server(first_ms=2, itl_ms=1)
        folder = sessions(*({"n_requests": 16, "think": 0.0, "n_out": 4} for _ in range(3)))
        flags = {**submission_flags(), "duration": 0.5}
        code, doc, _ = replay(server.url, "--traces", str(folder), "--conc", "2", *_argv(flags))
        assert code == 0
        _RUN["doc"] = doc
    return copy.deepcopy(_RUN["doc"])


def _rule(validity: dict, name: str) -> dict:
    return next(rule for rule in validity["rules"] if rule["rule"] == name)


def test_a_real_run_with_the_submission_flags_meets_every_rule(run_doc):
    validity = check_validity(run_doc, SHORT)
    assert validity["valid"] and validity["failed"] == []
    assert all(rule["ok"] is True for rule in validity["rules"])
    assert "InferenceX" in validity["rules_source"]
    assert _rule(validity, "cache_priming_warmup")["value"] == "10req"
    assert _rule(validity, "think_time_cap")["value"] == 300.0
    # AgentX's own 900 s minimum: the shortened window is the one rule a test run breaks
    assert check_validity(run_doc)["failed"] == ["window_duration"]


def _set(doc: dict, path: str, value: Any) -> None:
    *parents, key = path.split(".")
    node = doc
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[key] = value


@pytest.mark.parametrize(("path", "value", "failed"), [
    ("status", "interrupted", ["run_complete"]),
    ("config.mode", "poisson", ["mid_trace_start", "cache_priming_warmup"]),
    ("config.start_offset", [0.0, 0.0], ["mid_trace_start"]),
    ("config.warmup", "30s", ["cache_priming_warmup"]),
    ("config.warmup", "0req", ["cache_priming_warmup"]),
    ("config.traces.scale.config.think_time_cap", None, ["think_time_cap"]),
    ("config.traces.scale.config.think_time_cap", 301.0, ["think_time_cap"]),
    ("config.traces.scale.config.think_time_scale", 0.5, ["recorded_think_times"]),
    ("config.traces.scale.config.token_scale", 0.1, ["unscaled_tokens"]),
    ("config.traces.scale.dropped", 2, ["over_context"]),  # 2 of 48 requests
    ("config.traces.scale.trimmed", 1, ["over_context"]),  # 1 of 48: over 1 %
    ("levels.0.counts.error_rate", 0.11, ["error_rate"]),
    ("levels.0.counts.warmup_errors", {"timeout": 1}, ["warmup_failures"]),
    ("levels.0.window_s", 0.3, ["window_duration"]),
    ("levels.0.counts.requests_ok", 0, ["successful_requests"]),
    ("levels.0.requests", {"start_ms": [0.0, 25_000.0, 1000.0], "e2el_us": [2_000_000, 10, 3_000_000]},
     ["system_idle_gap"]),  # busy 0-4 s, then idle until 25 s
])
def test_each_rule_fails_by_name(run_doc, path, value, failed):
    _set(run_doc, path, value)
    validity = check_validity(run_doc, SHORT)
    assert not validity["valid"] and validity["failed"] == failed
    for name in failed:
        rule = _rule(validity, name)
        assert rule["ok"] is False and rule["detail"]


@pytest.mark.parametrize("changes", [
    {"levels.0.counts.error_rate": 0.10},  # equal to the limit: accepted, as InferenceX does
    {"config.traces.scale.dropped": 1, "config.traces.scale.requests": 100},  # exactly 1 %
    {"config.traces.scale.config.think_time_cap": 300.0},
    {"levels.0.requests": {"start_ms": [0.0, 14_000.0], "e2el_us": [4_000_000, 10]}},  # idle exactly 10 s
])
def test_values_at_a_limit_pass(run_doc, changes):
    for path, value in changes.items():
        _set(run_doc, path, value)
    assert check_validity(run_doc, SHORT)["valid"]


def test_the_worst_level_speaks_for_the_run(run_doc):
    second = copy.deepcopy(run_doc["levels"][0])
    second.update(label="conc 8", repeat=1)
    second["counts"]["error_rate"] = 0.25
    second["window_s"] = 0.41
    run_doc["levels"].append(second)
    validity = check_validity(run_doc, SHORT)
    assert validity["failed"] == ["error_rate"]
    errors = _rule(validity, "error_rate")
    assert errors["value"] == 0.25 and errors["limit"] == 0.10 and "conc 8 (repeat 1)" in errors["detail"]
    window = _rule(validity, "window_duration")
    assert window["ok"] and window["value"] == 0.41 and "conc 8" in window["detail"]


def test_a_results_file_lacking_keys_is_invalid_with_what_it_cannot_check(run_doc):
    del run_doc["config"]["traces"]["scale"]
    del run_doc["levels"][0]["counts"]["warmup_errors"]
    del run_doc["levels"][0]["requests"]
    validity = check_validity(run_doc, SHORT)
    unchecked = ["think_time_cap", "system_idle_gap", "recorded_think_times", "unscaled_tokens", "over_context",
                 "warmup_failures"]
    assert not validity["valid"] and validity["failed"] == unchecked
    for name in unchecked:
        rule = _rule(validity, name)
        assert rule["ok"] is None and rule["value"] is None and rule["detail"].startswith("not checkable")
    assert "levels[0].counts.warmup_errors" in _rule(validity, "warmup_failures")["detail"]
    assert _rule(validity, "over_context")["limit"] == 0.01  # the limit is given even so


def test_a_run_without_levels_or_config_checks_nothing():
    validity = check_validity({"levels": []})
    assert not validity["valid"]
    assert validity["failed"] == [rule["rule"] for rule in validity["rules"]]
    assert all(rule["ok"] is None for rule in validity["rules"])
    assert "none was measured" in _rule(validity, "error_rate")["detail"]


def test_the_submission_flags_parse_with_the_replay_parser():
    flags = submission_flags()
    args = build_parser(["replay"]).parse_args(["replay", *_argv(flags)])
    assert {dest: getattr(args, dest) for dest in flags} == flags
    assert flags["start_offset"] == "0.25:0.75" and flags["warmup"] == "10req" and flags["duration"] == 3600.0


def test_the_module_imports_nothing_heavy():
    """loadgen/cli/replay.py may read the submission flags while building its parser: no numpy, no histograms."""
    code = "import sys, loadgen.run.validity; print(sorted({'numpy', 'hdrh', 'loadgen.run.level'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_result_carries_its_validity_and_submission_keeps_the_flags_given(start_server, sessions, replay,
                                                                                capsys):
    server = start_server(first_ms=2, itl_ms=1)
    folder = sessions(*({"n_requests": 16, "think": 0.0, "n_out": 4} for _ in range(3)))
    code, doc, _ = replay(server.url, "--traces", str(folder), "--conc", "2", "--duration", "0.5")
    assert code == 0
    assert doc["validity"] == check_validity(doc) and not doc["validity"]["valid"]
    assert "cache_priming_warmup" in doc["validity"]["failed"]  # the replay's default warm-up is 0s
    code, doc, _ = replay(server.url, "--traces", str(folder), "--conc", "2", "--submission", "--duration", "0.5")
    assert code == 0
    config = doc["config"]
    assert config["warmup"] == "10req" and config["traces"]["scale"]["config"]["think_time_cap"] == 300.0
    assert config["duration_s"] == 0.5  # given: kept, and the one rule the run breaks
    assert doc["validity"]["failed"] == ["window_duration"]


def test_submission_refuses_an_open_loop(replay_cli_error):
    code, err = replay_cli_error("--submission", "--rate", "1")
    assert code == 2 and "--submission: AgentX runs are closed loop" in err
