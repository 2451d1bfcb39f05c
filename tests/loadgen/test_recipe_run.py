"""`loadgen recipe run` with real processes on 127.0.0.1: a server that never becomes healthy or
exits is reported naming its command and leaves no process behind; Ctrl-C keeps finished runs
and `--resume` completes the recipe (the A/A and planted-delay recipe on the tiny engine is in
test_recipe_calibration.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from loadgen.cli import main
from tests.loadgen.conftest import processes_with, sse_server_command, write_recipe

pytestmark = pytest.mark.slow  # tens of seconds: scheduled first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
SSE_SERVER = Path(__file__).with_name("sse_server.py")


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
    path = write_recipe(tmp_path, _command_recipe(command, startup_timeout_s=3))
    assert main(["recipe", "run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "not healthy within server.startup_timeout_s = 3 s" in err and marker in err
    time.sleep(0.5)
    assert processes_with(marker) == []


def test_a_server_that_exits_is_named_with_its_exit_code(tmp_path, capsys):
    marker = f"exits-{uuid.uuid4().hex}"
    command = f"{sys.executable} -c \"import sys; print('cannot bind'); sys.exit(3)\" {marker} {{port}}"
    path = write_recipe(tmp_path, _command_recipe(command))
    assert main(["recipe", "run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "exited with code 3 before it was healthy" in err and marker in err and "cannot bind" in err
    assert processes_with(marker) == []


def test_an_existing_folder_needs_resume(tmp_path, capsys):
    path = write_recipe(tmp_path, _command_recipe(f"{sys.executable} {SSE_SERVER} {{port}}"))
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
    path, out = write_recipe(tmp_path, doc), tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # Started as a script's background job is: SIGINT ignored, inherited (the recipe must take it anyway).
    recipe = subprocess.Popen([sys.executable, "-m", "loadgen.cli", "recipe", "run", str(path), "--out", str(out)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tmp_path,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    first = out / "runs" / "a-r1" / "result.json"
    deadline = time.monotonic() + 120
    while not (out / "runs" / "b-r1" / "command.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    recipe.send_signal(stop)  # Ctrl-C (or a kill) while b-r1 runs
    assert recipe.wait(timeout=120) == 130
    assert "--resume --out" in recipe.stderr.read().decode()
    assert processes_with(marker) == []
    created = json.loads(first.read_text())["created"]
    assert main(["recipe", "run", str(path), "--out", str(out), "--resume", "--quiet"]) == 0
    assert json.loads(first.read_text())["created"] == created  # the finished run was kept, not redone
    for name in ("a-r1", "b-r1", "a-r2", "b-r2"):
        assert json.loads((out / "runs" / name / "result.json").read_text())["status"] == "complete"
    comparison = json.loads((out / "compare" / "b-vs-a.json").read_text())
    assert comparison["paired"] and comparison["levels"][0]["method"].startswith("paired rounds")
    page = (out / "report" / "report.html").read_text()
    assert "b vs a (baseline)" in page and "a-r2" in page and "b-r2" in page
    assert processes_with(marker) == []


def test_a_server_at_a_url_is_only_health_checked(tmp_path, start_server, sessions):
    folder = sessions(*({"n_requests": 2, "think": 0.0, "n_out": 4} for _ in range(4)))
    server = start_server(first_ms=2, itl_ms=2)
    doc = {"name": "u", "server": {"kind": "url", "url": server.url, "health_path": "/v1/models"},
           "workload": {"traces": str(folder)}, "sweep": {"conc": [1], "duration_s": 0.5, "repeats": 2},
           "variants": [{"name": "a"}, {"name": "a2", "control": True}]}
    out = tmp_path / "out"
    assert main(["recipe", "run", str(write_recipe(tmp_path, doc)), "--out", str(out), "--quiet"]) == 0
    assert server.proc.poll() is None  # a server the recipe did not start is left running
    assert json.loads((out / "compare" / "a2-vs-a.json").read_text())["levels"][0]["method"].startswith("paired")


def test_kept_servers_start_once_per_variant_and_each_round_replays_its_own_seed(tmp_path, sessions):
    folder = sessions(*({"n_requests": 3, "think": 0.0, "n_out": 4} for _ in range(4)))
    starts = tmp_path / "starts.txt"
    marker = f"kept-{uuid.uuid4().hex}"
    note = f"import os; open({str(starts)!r}, 'a').write(os.environ.get('AGENTLOAD_TEST_VARIANT', 'a') + chr(10))"
    command = sse_server_command(note, model=marker)  # notes each start, then serves
    doc = _command_recipe(command, str(folder), health_path="/v1/models")
    doc["sweep"].update(servers="kept", repeats=3, seed=5)
    out = tmp_path / "out"
    assert main(["recipe", "run", str(write_recipe(tmp_path, doc)), "--out", str(out), "--quiet"]) == 0
    assert sorted(starts.read_text().split()) == ["a", "b"]  # one start per variant, not per run
    for k in (1, 2, 3):
        for variant in ("a", "b"):
            run = out / "runs" / f"{variant}-r{k}"
            assert json.loads((run / "result.json").read_text())["status"] == "complete"
            assert f"--seed {4 + k} " in (run / "command.txt").read_text()
    assert (out / "servers" / "a.log").exists() and (out / "servers" / "b.log").exists()
    assert processes_with(marker) == []


def test_a_kept_server_that_died_stops_the_recipe_naming_it(tmp_path):
    from loadgen.recipe.runner import PlannedRun, RecipeRun, RecipeRunError
    from loadgen.recipe.schema import recipe_from_dict
    from loadgen.recipe.server import RunningServer

    doc = _command_recipe(f"{sys.executable} {SSE_SERVER} {{port}}")
    doc["sweep"]["servers"] = "kept"
    recipe = recipe_from_dict(doc)
    server = RunningServer(recipe, recipe.baseline, tmp_path / "a.log")
    server.process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    server.process.wait()
    with pytest.raises(RecipeRunError, match="variant a: its kept server exited with code 3; see .*a.log"):
        RecipeRun(recipe, tmp_path / "out", resume=False, quiet=True)._one(PlannedRun(1, recipe.baseline), server)


def test_each_variant_is_served_by_the_tree_in_its_cwd(tmp_path, sessions):
    """`cwd` runs another tree of the repository's server (an older revision, say) under this
    loadgen: server.cwd for the baseline, a variant's own for the variant; each tree's processes
    (the server and its engine) note their pid as they import its server package."""
    starts = tmp_path / "starts.txt"
    trees = {name: tmp_path / name for name in ("base", "other")}
    for name, tree in trees.items():
        for package in ("server", "kernels", "golden_al"):
            shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
        with (tree / "server" / "__init__.py").open("a") as init:
            init.write(f"\nimport os as _os\nopen({str(starts)!r}, 'a').write(f'{name} {{_os.getpid()}}\\n')\n")
    folder = sessions(*({"n_requests": 2, "think": 0.0, "n_out": 4} for _ in range(2)))
    marker = f"tiny-{uuid.uuid4().hex}"
    doc = {"name": "trees", "server": {"kind": "ours", "startup_timeout_s": 300, "cwd": str(trees["base"]),
                                       "flags": {"model": "tiny", "device": "cpu", "served_model_name": marker}},
           "workload": {"traces": str(folder)}, "sweep": {"conc": [1], "duration_s": 1.0, "repeats": 1},
           "variants": [{"name": "base"}, {"name": "other", "cwd": str(trees["other"])}]}
    out = tmp_path / "out"
    assert main(["recipe", "run", str(write_recipe(tmp_path, doc)), "--out", str(out), "--quiet"]) == 0
    noted = [line.split() for line in starts.read_text().splitlines()]
    pids = {name: {pid for tree, pid in noted if tree == name} for name in trees}
    assert len(noted) == 4 and all(len(p) == 2 for p in pids.values()), noted  # server + engine, once each
    for variant in ("base", "other"):
        assert json.loads((out / "runs" / f"{variant}-r1" / "result.json").read_text())["status"] == "complete"
    assert processes_with(marker) == []
