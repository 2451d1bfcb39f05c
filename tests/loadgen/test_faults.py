"""Failures: a server that resets streams, answers 500, stalls, cuts streams short, or dies."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from loadgen.results.file import read_results

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kind, error", [("reset", "reset"), ("500", "http_500"), ("short", "truncated")])
def test_failed_requests_are_counted_by_kind(start_server, sessions, replay, kind, error, read_path):
    server = start_server(first_ms=1, fault={"kind": kind, "every": 3})
    folder = sessions(*({"n_requests": 10, "think": 0.0, "n_out": 6} for _ in range(2)))
    code, doc, records = replay(server.url, "--traces", str(folder), "--conc", "2", "--duration", "0.8")
    level = doc["levels"][0]
    counts = level["counts"]
    seen = server.records()["records"]
    faulty = {r["id"] for r in seen if r["fault"]}
    assert faulty
    assert {r["error"] for r in records if r["id"] in faulty} == {error}
    assert all(r["error"] is None for r in records if r["id"] not in faulty)
    assert counts["errors"][error] + sum(counts["warmup_errors"].values()) == len(faulty)
    assert len(records) == len(seen)  # nothing silently dropped
    # a third of the requests fail: above the default 10 % the level is failed, exit code 1
    assert level["failed"] and "error rate" in level["fail_reasons"][0]
    assert code == 1
    assert level["metrics"]["ttft"]["stats"]["count"] == counts["requests_ok"]


def test_error_rate_threshold_is_a_flag(start_server, sessions, replay):
    server = start_server(fault={"kind": "500", "every": 4})
    folder = sessions({"n_requests": 10, "think": 0.0, "n_out": 2})
    code, doc, _ = replay(server.url, "--traces", str(folder), "--duration", "0.5", "--max-error-rate", "0.5")
    assert code == 0 and not doc["levels"][0]["failed"]


def test_a_stalled_stream_times_out_and_never_hangs_the_run(start_server, sessions, replay):
    server = start_server(fault={"kind": "stall", "every": 2})
    folder = sessions({"n_requests": 6, "think": 0.0, "n_out": 4})
    code, doc, records = replay(server.url, "--traces", str(folder), "--duration", "1", "--timeout", "0.4",
                                "--max-error-rate", "1")
    assert code == 0
    assert {r["error"] for r in records} == {None, "timeout"}
    timed_out = [r for r in records if r["error"] == "timeout"]
    assert timed_out and all(r["end_ns"] - r["start_ns"] >= 390_000_000 for r in timed_out), [
        r["end_ns"] - r["start_ns"] for r in timed_out]


def test_a_dying_server_ends_the_run_with_partial_results(start_server, sessions, replay, capsys):
    server = start_server(first_ms=5, itl_ms=2)
    folder = sessions(*({"n_requests": 50, "think": 0.01, "n_out": 8} for _ in range(4)))
    threading.Timer(1.0, server.stop).start()
    code, doc, records = replay(server.url, "--traces", str(folder), "--conc", "2,4", "--duration", "30")
    assert code == 1
    assert "refused 5 connections in a row" in capsys.readouterr().err
    assert doc["status"] == "server_dead" and "refused" in doc["message"]
    level = doc["levels"][0]
    assert len(doc["levels"]) == 1 and level["counts"]["requests_ok"] > 0
    assert level["counts"]["errors"].get("connect", 0) >= 5
    assert level["window_s"] < 30


def test_interrupt_writes_what_was_measured(start_server, sessions, tmp_path):
    server = start_server(first_ms=5, itl_ms=2)
    folder = sessions({"n_requests": 50, "think": 0.01, "n_out": 8})
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "loadgen.cli", "replay", "--url", server.url, "--traces",
                             str(folder), "--duration", "60", "--out", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().startswith("-- conc 1")
    threading.Timer(1.5, proc.send_signal, [signal.SIGINT]).start()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "interrupted" in err
    doc = read_results(out / "result.json")
    assert doc["status"] == "interrupted"
    assert doc["levels"][0]["counts"]["requests_ok"] > 0


def test_a_run_killed_between_levels_is_not_left_complete(start_server, sessions, tmp_path):
    """After each level the results are written, saying the run was still going: a process killed
    before its last write (kill -9) never leaves a file that `recipe run --resume` takes as done."""
    server = start_server(first_ms=5, itl_ms=2)
    folder = sessions({"n_requests": 50, "think": 0.01, "n_out": 8})
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "loadgen.cli", "replay", "--url", server.url, "--traces",
                             str(folder), "--conc", "1,1", "--duration", "1", "--out", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = iter(proc.stdout.readline, "")
    assert any(line.startswith("-- conc 1 (") or line.startswith("-- conc 1:") for line in lines)
    assert any(line.startswith("-- conc 1") for line in lines)  # the second level began: the first is written
    proc.kill()
    proc.wait(timeout=30)
    doc = read_results(out / "result.json")
    assert doc["status"] == "interrupted" and doc["message"] == "the run was still going when this was written"
    assert len(doc["levels"]) == 1


def test_an_unreachable_server_is_a_clear_error(replay_cli_error):
    code, err = replay_cli_error("--url", "http://127.0.0.1:9")
    assert code == 1 and "cannot reach the server at http://127.0.0.1:9" in err


def test_a_server_that_never_answers_is_bounded_by_timeout(replay_cli_error):
    # Listening but never accepting: the kernel completes the handshake, no byte ever comes back.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        code, err = replay_cli_error("--url", url, "--timeout", "1")
        waited = time.monotonic() - start
    assert code == 1 and waited < 10, waited
    assert f"cannot reach the server at {url}: waited for the model list (GET {url}/v1/models) and got no " \
           "answer within 1 s (--timeout)" in err


def test_an_unwritable_out_folder_is_refused_before_the_run(start_server, sessions, replay_cli_error):
    server = start_server()
    folder = sessions({"n_requests": 3, "think": 0.0})
    code, err = replay_cli_error("--url", server.url, "--traces", str(folder), "--out", "/proc/x")
    assert code == 2 and "--out /proc/x: cannot write there" in err and "Traceback" not in err
    code, err = replay_cli_error("--url", server.url, "--traces", str(folder), "--per-request", "/proc/x/r.jsonl")
    assert code == 2 and "--per-request /proc/x: cannot write there" in err
    assert server.records()["records"] == []  # refused before a single request


def test_results_survive_an_out_folder_that_breaks_during_the_run(start_server, sessions, tmp_path):
    server = start_server(first_ms=5, itl_ms=2)
    folder = sessions({"n_requests": 50, "think": 0.01, "n_out": 8})
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "loadgen.cli", "replay", "--url", server.url, "--traces",
                             str(folder), "--duration", "1.5", "--out", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().startswith("-- conc 1")  # checked writable, now measuring
    shutil.rmtree(out, ignore_errors=True)  # the probe's folder is made again when the results are written
    out.write_text("a file where the results folder was")
    stdout, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "Traceback" not in err and f"cannot write results to {out / 'result.json'}" in err
    fallback = Path(err.rpartition("wrote them to ")[2].split(" instead")[0])
    try:
        doc = read_results(fallback)
        assert doc["status"] == "complete" and doc["levels"][0]["counts"]["requests_ok"] > 0
        assert f"results: {fallback}" in stdout
    finally:
        fallback.unlink()


def test_replay_refuses_hash_ids_shorter_than_the_input(start_server, tmp_path, replay_cli_error):
    server = start_server()
    trace = tmp_path / "short" / "s.json"
    trace.parent.mkdir()
    trace.write_text('{"id": "s", "block_size": 64, "requests": [{"in": 200, "out": 2, "hash_ids": [1, 2, 3]}, '
                     '{"in": 300, "out": 2, "hash_ids": [1, 2, 3]}]}')
    code, err = replay_cli_error("--url", server.url, "--traces", str(trace.parent))
    assert code == 2 and "Traceback" not in err
    assert f"{trace}: requests[1]: field 'hash_ids': 3 ids but the input (300 tokens) has 4 full blocks" in err
    assert server.records()["records"] == []


@pytest.mark.parametrize(("config", "detail"), [
    ({"token_ids_as_text": True}, "token_ids is a str, not a list of token ids"),
    ({"extra_tokens": 16}, "asked for 8 tokens (max_tokens), got more: 24 streamed"),
    ({"usage_completion_tokens": 1e30}, "usage field completion_tokens is not a count: 1e+30"),
    ({"usage_completion_tokens": "8"}, "usage field completion_tokens is not a count: 8"),
    ({"cached_tokens": -100}, "usage field cached_tokens is not a count: -100"),
    ({"cached_tokens": 10**6}, "usage says 1000000 cached prompt tokens, more than the prompt's"),
])
def test_numbers_a_server_cannot_have_are_protocol_errors_not_throughput(start_server, sessions, replay, config,
                                                                         detail, read_path):
    """A server's counts are checked against what was asked and received: none of these inflates
    a rate or a cache hit; every request is a protocol error naming what was wrong."""
    server = start_server(first_ms=1, itl_ms=1, **config)
    folder = sessions({"n_requests": 6, "think": 0.0, "n_out": 8})
    code, doc, records = replay(server.url, "--traces", str(folder), "--duration", "0.5", "--max-error-rate", "1")
    level = doc["levels"][0]
    assert level["counts"]["requests_ok"] == 0 and level["counts"]["errors"]["protocol"] > 0
    assert level["throughput"]["output_tokens_per_s"] == 0 and level["cache"]["cached_tokens"] is None
    assert all(detail in r["error_detail"] for r in records if r["counted"] or r["error"]), records[0]["error_detail"]
    assert code == 1  # every level failed: no request completed in its window


def test_a_lane_that_raises_stops_the_run_counted_and_said(start_server, sessions, replay, monkeypatch, capsys):
    """A bug in a lane (here: the plan's joins raise on the third request of a play) is never lost:
    the request it was about is an error of kind `client`, the run stops as failed with what it
    measured, and the exit code and message say so."""
    from loadgen.run import plan

    joins = plan.joins_before

    def broken(session, position):
        if position == 2:
            raise OverflowError("int too large to convert")
        return joins(session, position)

    monkeypatch.setattr(plan, "joins_before", broken)
    server = start_server(first_ms=1, itl_ms=1)
    code, doc, _ = replay(server.url, "--traces", str(sessions({"n_requests": 8, "think": 0.0})), "--duration", "2",
                          "--start-offset", "0:0")
    assert code == 1
    assert doc["status"] == "failed" and "OverflowError: int too large to convert" in doc["message"]
    assert doc["levels"][0]["counts"]["errors"]["client"] >= 1
    assert "loadgen failed in a client task" in capsys.readouterr().err


def test_a_per_request_file_on_a_full_disk_fails_the_run_and_keeps_the_results(start_server, sessions, tmp_path):
    from loadgen.cli import main
    from loadgen.results.file import read_results

    server = start_server(first_ms=1, itl_ms=1)
    out = tmp_path / "out"
    code = main(["replay", "--url", server.url, "--traces", str(sessions({"n_requests": 30, "think": 0.0})),
                 "--duration", "1", "--per-request", "/dev/full", "--out", str(out), "--quiet"])
    assert code == 1
    doc = read_results(out / "result.json")
    assert doc["status"] == "failed" and "No space left on device" in doc["message"]
    assert doc["levels"] and doc["levels"][0]["counts"]["requests_ok"] > 0
