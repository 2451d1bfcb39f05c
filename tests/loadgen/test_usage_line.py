"""The product's usage line, as a new user types it: `server start`, then `loadgen replay --conc N`.

Against our own server (the real tiny engine on CPU here) the bundled sessions are fitted to it
the way `loadgen bench` fits them, and the first lines say so; against a foreign server nothing
is rescaled.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadgen.defaults import LOCAL_SERVER_URL
from loadgen.report.table import CACHE_MISSES_EXPECTED
from loadgen.run.flags import fit_bundled_sessions
from loadgen.run.presets import preset_for
from loadgen.transport.base import ServerInfo

pytestmark = pytest.mark.slow  # tens of seconds: scheduled first (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]


def test_replay_defaults_to_where_server_start_listens():
    from server.cli import build_parser

    args = build_parser().parse_args(["start"])
    assert LOCAL_SERVER_URL == f"http://{args.host}:{args.port}"


@pytest.fixture
def tiny_server(tmp_path):
    """`server start` with its defaults (the tiny model), on a free port."""
    log = tmp_path / "server.log"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "server.cli", "start", "--port", "0", "--device", "cpu"],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while not (match := re.search(r"ready at (http://\S+)", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield match.group(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_replay_against_our_server_fits_the_bundled_sessions(tiny_server, tmp_path, capsys):
    from loadgen.cli import main

    out = tmp_path / "out"
    code = main(["replay", "--url", tiny_server, "--conc", "2", "--duration", "3", "--warmup", "1req",
                 "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    preset = preset_for("tiny")
    first = text.splitlines()[0]
    assert "our server (tiny" in first and f"--token-scale {preset.token_scale:g}" in first
    assert "--think-time-scale" in text.splitlines()[1]  # how to override
    scale = json.loads((out / "result.json").read_text())["config"]["traces"]["scale"]["config"]
    assert scale["token_scale"] == preset.token_scale and scale["think_time_cap"] == preset.think_time_cap
    # a flag the user gives wins, and is no longer announced as chosen
    code = main(["replay", "--url", tiny_server, "--conc", "1", "--duration", "3", "--warmup", "1req",
                 "--token-scale", "0.01", "--out", str(out)])
    first = capsys.readouterr().out.splitlines()[0]
    assert code == 0 and "--token-scale" not in first and "--think-time-scale" in first
    assert json.loads((out / "result.json").read_text())["config"]["traces"]["scale"]["config"]["token_scale"] == 0.01


def test_a_foreign_server_gets_the_sessions_unscaled(start_server, tmp_path, capsys):
    from loadgen.cli import main

    server = start_server(max_model_len=10**9)  # not ours: owned_by is not agentload
    out = tmp_path / "out"
    # unscaled, the recorded think times are minutes: the 1 s window measures nothing (exit 1)
    code = main(["replay", "--url", server.url, "--duration", "1", "--warmup", "1req", "--out", str(out)])
    text = capsys.readouterr().out
    assert code in (0, 1) and "-- conc 1" in text and "our server" not in text and "scale" not in text
    scale = json.loads((out / "result.json").read_text())["config"]["traces"]["scale"]["config"]
    assert scale["token_scale"] == scale["think_time_scale"] == 1.0 and scale["think_time_cap"] is None


def test_no_server_at_the_default_address_says_what_to_do(capsys, tmp_path):
    import socket
    from urllib.parse import urlsplit

    from loadgen.cli import main

    address = urlsplit(LOCAL_SERVER_URL)
    with socket.socket() as probe:
        if probe.connect_ex((address.hostname, address.port)) == 0:
            pytest.skip(f"something listens on {LOCAL_SERVER_URL}")
    code = main(["replay", "--conc", "1", "--duration", "1", "--timeout", "5", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1 and LOCAL_SERVER_URL in err and "`server start`" in err and "--url" in err


def test_the_real_scale_model_gets_the_sessions_at_their_recorded_length():
    """v32 (163,840-token context) is where the real sessions are measured: replay against it
    takes no token scaling and no think-time cap, only what the user gives."""
    info = ServerInfo(model="v32", ours=True, max_model_len=163840, num_gpus=1, vocab_size=129280,
                      raw={"root": "v32"})
    args = argparse.Namespace(command="replay", traces=None, workers=None, token_scale=None,
                              think_time_scale=None, think_time_cap=None)
    lines = fit_bundled_sessions(args, info)
    assert (args.token_scale, args.think_time_scale, args.think_time_cap) == (1.0, 1.0, None)
    assert "--token-scale 1 --think-time-scale 1" in lines[0] and "--think-time-cap" not in lines[0]
    args = argparse.Namespace(command="replay", traces=None, workers=None, token_scale=None,
                              think_time_scale=None, think_time_cap=None)
    fit_bundled_sessions(args, dataclasses.replace(info, model="small", max_model_len=32768, raw={"root": "small"}))
    assert args.token_scale == preset_for("small").token_scale < 1.0


def test_a_second_run_with_the_same_seed_is_told_the_server_cache_held_its_prompts(tiny_server, tmp_path, capsys):
    """The same replay twice against one server: the second run's prompts are the first's (same
    seed), so its window is served from a warm prefix cache beyond what the trace shares; it says
    so. The first run, on a fresh server, measures no more than the trace shares and says nothing."""
    from loadgen.cli import main

    texts, docs = [], []
    for run in ("first", "second"):
        out = tmp_path / run
        code = main(["replay", "--url", tiny_server, "--conc", "2", "--duration", "3", "--warmup", "1req",
                     "--out", str(out)])
        texts.append(capsys.readouterr().out)
        assert code == 0, texts[-1]
        docs.append(json.loads((out / "result.json").read_text())["levels"][0]["cache"])
    first, second = docs
    misses = [1 - doc["measured_hit_rate"] for doc in docs]
    assert misses[1] < CACHE_MISSES_EXPECTED * (1 - second["trace_theoretical_hit_rate"]) < misses[0]
    assert "more than the trace shares" not in texts[0]
    assert "more than the trace shares" in texts[1] and "same --seed" in texts[1]
