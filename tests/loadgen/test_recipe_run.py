"""`loadgen recipe run` with real processes on 127.0.0.1: a server that never becomes healthy or
exits is reported naming its command and leaves no process behind; Ctrl-C keeps finished runs
and `--resume` completes the recipe; on the tiny engine, an A/A pair stays within the documented
false-verdict bound and a planted per-step delay is detected."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from loadgen.cli import main

pytestmark = pytest.mark.slow  # tens of seconds: scheduled first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
SSE_SERVER = Path(__file__).with_name("sse_server.py")
FALSE_VERDICT_BOUND = 0.05  # README "Calibration": A/A false verdicts per metric row


def _write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _processes_with(marker: str) -> list[int]:
    """Pids whose command line holds `marker` (our own test process excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _command_recipe(command: str, traces: str = "agentic-coding", **server) -> dict:
    return {"name": "t", "server": {"kind": "command", "command": command, **server},
            "workload": {"traces": traces, "token_scale": 0.02, "think_time_scale": 0.01, "think_time_cap": 0.2},
            "sweep": {"conc": [2], "duration_s": 1.0, "repeats": 2, "seed": 1},
            "variants": [{"name": "a"}, {"name": "b", "env": {"AGENTLOAD_TEST_VARIANT": "b"}}]}


def test_a_server_never_healthy_is_named_and_its_process_group_killed(tmp_path, capsys):
    marker = f"never-healthy-{uuid.uuid4().hex}"
    child = ("import subprocess, sys, time; "
             f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '{marker}']); time.sleep(600)")
    command = f"{sys.executable} -c \"{child}\" {marker} {{port}}"
    path = _write(tmp_path, _command_recipe(command, startup_timeout_s=3))
    assert main(["recipe", "run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "not healthy within server.startup_timeout_s = 3 s" in err and marker in err
    time.sleep(0.5)
    assert _processes_with(marker) == []


def test_a_server_that_exits_is_named_with_its_exit_code(tmp_path, capsys):
    marker = f"exits-{uuid.uuid4().hex}"
    command = f"{sys.executable} -c \"import sys; print('cannot bind'); sys.exit(3)\" {marker} {{port}}"
    path = _write(tmp_path, _command_recipe(command))
    assert main(["recipe", "run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "exited with code 3 before it was healthy" in err and marker in err and "cannot bind" in err
    assert _processes_with(marker) == []


def test_an_existing_folder_needs_resume(tmp_path, capsys):
    path = _write(tmp_path, _command_recipe(f"{sys.executable} {SSE_SERVER} {{port}}"))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    assert main(["recipe", "run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "exists and is not empty; give --resume" in capsys.readouterr().err


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_recipe_keeps_finished_runs_and_resumes(tmp_path, sessions, capsys, stop):
    folder = sessions(*({"n_requests": 3, "think": 0.0, "n_out": 6} for _ in range(8)))
    marker = f"sse-{uuid.uuid4().hex}"
    config = json.dumps({"port": 0, "first_ms": 5, "itl_ms": 5, "model": marker}).replace('"port": 0', '"port": {port}')
    doc = _command_recipe(f"{sys.executable} {SSE_SERVER} --config '{config}'", str(folder), health_path="/v1/models")
    path, out = _write(tmp_path, doc), tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    recipe = subprocess.Popen([sys.executable, "-m", "loadgen.cli", "recipe", "run", str(path), "--out", str(out)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    first = out / "runs" / "a-r1" / "result.json"
    deadline = time.monotonic() + 120
    while not (out / "runs" / "b-r1" / "command.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    recipe.send_signal(stop)  # Ctrl-C (or a kill) while b-r1 runs
    assert recipe.wait(timeout=120) == 130
    assert "--resume --out" in recipe.stderr.read().decode()
    assert _processes_with(marker) == []
    created = json.loads(first.read_text())["created"]
    assert main(["recipe", "run", str(path), "--out", str(out), "--resume", "--quiet"]) == 0
    assert json.loads(first.read_text())["created"] == created  # the finished run was kept, not redone
    for name in ("a-r1", "b-r1", "a-r2", "b-r2"):
        assert json.loads((out / "runs" / name / "result.json").read_text())["status"] == "complete"
    comparison = json.loads((out / "compare" / "b-vs-a.json").read_text())
    assert comparison["paired"] and comparison["levels"][0]["method"].startswith("paired rounds")
    page = (out / "report" / "report.html").read_text()
    assert "b vs a (baseline)" in page and "a-r2" in page and "b-r2" in page
    assert _processes_with(marker) == []


def test_a_a_on_the_tiny_engine_stays_within_the_bound_and_a_planted_delay_is_found(tmp_path, sessions):
    # Sessions of 8-20-token answers: a request's TPOT spans 7-19 gaps and a window holds several
    # requests even on the slow variant, so one busy moment of a shared CI core does not decide a
    # round's TPOT p50 (with the bundled sessions at token_scale 0.02, a round's p50 was two
    # requests of 3-4 tokens, and the planted 5x was once read as noise on 2 degrees of freedom).
    # Answer lengths differ between sessions, so E2EL p90 and its per-token forms are not one
    # number thrice. Two controls make 60 A/A rows: one chance cluster of correlated rows (a
    # run-level shift moves the E2EL family together) cannot pass for a 5 % rate by itself.
    folder = sessions(*({"n_requests": 40, "think": 0.0, "n_out": n_out} for n_out in (8, 12, 16, 20)))
    marker = f"tiny-{uuid.uuid4().hex}"
    doc = {"name": "aab", "server": {"kind": "ours", "startup_timeout_s": 300,
                                     "flags": {"model": "tiny", "device": "cpu", "served_model_name": marker}},
           "workload": {"traces": str(folder)},
           "sweep": {"conc": [1, 2], "duration_s": 1.5, "warmup": "1req", "repeats": 3, "seed": 7},
           "variants": [{"name": "A"}, {"name": "A2", "control": True}, {"name": "A3", "control": True},
                        {"name": "slow", "flags": {"step_delay_ms": 60}}]}
    out = tmp_path / "out"
    assert main(["recipe", "run", str(_write(tmp_path, doc)), "--out", str(out), "--quiet"]) == 0
    assert _processes_with(marker) == []
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


def test_a_server_at_a_url_is_only_health_checked(tmp_path, start_server, sessions):
    folder = sessions(*({"n_requests": 2, "think": 0.0, "n_out": 4} for _ in range(4)))
    server = start_server(first_ms=2, itl_ms=2)
    doc = {"name": "u", "server": {"kind": "url", "url": server.url, "health_path": "/v1/models"},
           "workload": {"traces": str(folder)}, "sweep": {"conc": [1], "duration_s": 0.5, "repeats": 2},
           "variants": [{"name": "a"}, {"name": "a2", "control": True}]}
    out = tmp_path / "out"
    assert main(["recipe", "run", str(_write(tmp_path, doc)), "--out", str(out), "--quiet"]) == 0
    assert server.proc.poll() is None  # a server the recipe did not start is left running
    assert json.loads((out / "compare" / "a2-vs-a.json").read_text())["levels"][0]["method"].startswith("paired")
