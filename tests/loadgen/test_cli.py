"""`loadgen replay` on the command line: help, flag errors, table output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.cli import COMMAND_MODULES, build_parser, main
from loadgen.results.file import read_results

ROOT = Path(__file__).resolve().parents[2]


def test_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["replay", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--url", "--conc", "--duration", "--warmup", "--traces", "--rate", "--time-scale",
                 "--endpoint", "--max-error-rate", "--per-request", "--gpus", "--vocab-size"):
        assert flag in out


@pytest.mark.parametrize("flags, message", [
    (["--conc", "0"], "--conc: expected positive numbers"),
    (["--conc", "a,b"], "--conc: expected comma-separated numbers"),
    (["--rate", "-1"], "--rate: expected positive numbers"),
    (["--warmup", "soon"], "--warmup: expected seconds like '30s' or requests like '2req'"),
    (["--start-offset", "0.8:0.2"], "--start-offset: need 0 <= LO <= HI <= 1"),
    (["--header", "novalue"], "--header: expected K:V"),
    (["--duration", "0"], "--duration: must be > 0"),
    (["--max-error-rate", "2"], "--max-error-rate: must be within 0..1"),
    (["--url", "localhost:8000"], "--url: expected http://HOST:PORT"),
])
def test_bad_flags_are_named(capsys, flags, message):
    assert main(["replay", "--url", "http://127.0.0.1:9", *flags]) == 2
    assert message in capsys.readouterr().err


def test_bad_trace_is_named(start_server, tmp_path, replay_cli_error):
    server = start_server()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 1, "input_length": "many", "output_length": 3, "hash_ids": []}\n')
    code, err = replay_cli_error("--url", server.url, "--traces", str(bad))
    assert code == 2 and "bad.jsonl" in err and "input_length" in err


def test_our_server_is_detected_and_its_limits_used(start_server, sessions, replay):
    server = start_server(owned_by="agentload", num_gpus=4, max_model_len=900, vocab_size=1024, keep_prompts=True)
    folder = sessions({"n_requests": 12, "think": 0.0, "n_out": 4})  # inputs 200..970 tokens
    code, doc, records = replay(server.url, "--traces", str(folder), "--duration", "0.4")
    assert code == 0
    config = doc["config"]
    assert config["gpus"] == 4 and config["server"]["ours"] and config["model"] == "test-model"
    assert config["vocab"] == {"offset": 0, "size": 256}
    assert config["traces"]["scale"]["dropped"] > 0  # over max_model_len: dropped, not sent
    assert all(r["isl"] + r["osl_asked"] <= 900 for r in records)
    assert all(max(rec["prompt"]) < 256 for rec in server.records()["records"])
    tput = doc["levels"][0]["throughput"]
    assert tput["gpus"] == 4
    assert tput["output_tokens_per_s_per_gpu"] == pytest.approx(tput["output_tokens_per_s"] / 4, rel=1e-3)


def test_table_and_results_path_are_printed(start_server, sessions, tmp_path, capsys, monkeypatch):
    server = start_server()
    folder = sessions({"n_requests": 5, "think": 0.0, "n_out": 3})
    out = tmp_path / "out"
    argv = ["replay", "--url", server.url, "--traces", str(folder), "--duration", "0.3",
            "--out", str(out), "--header", "X-Test: 1", "--api-key", "k"]
    monkeypatch.setattr(sys, "argv", ["loadgen", *argv])
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "== conc 1" in text and "TTFT" in text and "interactivity (slow tail)" in text
    assert f"results: {out / 'result.json'}" in text
    seen = server.records()["records"]
    assert seen and all(r["authorization"] == "Bearer k" and r["x_test"] == "1" for r in seen)
    command_line = read_results(out / "result.json")["config"]["command_line"]
    assert command_line[-4:] == ["--header", "***", "--api-key", "***"]  # secrets stay out of results
    assert all(r["model"] == "test-model" and r["user"].startswith("agentload-") for r in seen)


def test_every_result_records_its_launch_and_no_secret(start_server, sessions, tmp_path):
    """A plain replay keeps loadgen's whole command line, the environment that shapes a benchmark and the
    package versions; another server's launch is unknown, not guessed; the key, a header's value and
    secret variables appear nowhere in the results."""
    server = start_server()
    folder = sessions({"n_requests": 3, "think": 0.0, "n_out": 3})
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NCCL_DEBUG": "INFO", "HF_TOKEN": "hf-secret-1",
           "AGENTLOAD_API_KEY": "sk-secret-2"}
    done = subprocess.run([sys.executable, "-m", "loadgen.cli", "replay", "--url", server.url, "--traces",
                           str(folder), "--duration", "0.3", "--out", str(out), "--quiet", "--api-key", "sk-secret-3",
                           "--header=X-Token: secret-4"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    text = (out / "result.json").read_text()
    for secret in ("hf-secret-1", "sk-secret-2", "sk-secret-3", "secret-4"):
        assert secret not in text
    launch = read_results(out / "result.json")["launch"]
    assert launch["load_argv"][:4] == [sys.executable, "-m", "loadgen.cli", "replay"]
    assert launch["load_argv"][-3:] == ["--api-key", "***", "--header=***"]
    assert launch["load_env"]["NCCL_DEBUG"] == "INFO" and "HF_TOKEN" not in launch["load_env"]
    assert launch["load_cwd"] == str(ROOT) and "numpy" in launch["versions"]["packages"]
    assert launch["server"]["kind"] == "other" and launch["server"]["url"] == server.url
    assert launch["server"]["argv"] is None and "not our server" in launch["server"]["argv_unknown"]
    assert launch["server"]["process_env"] is None and launch["server"]["versions"] is None
    assert launch["recipe"] is None and launch["recipe_fingerprint"] is None


def test_a_trace_too_long_for_the_server_says_how_to_shrink_it(start_server, sessions, replay_cli_error):
    server = start_server(max_model_len=100)
    folder = sessions({"n_requests": 3, "think": 0.0, "n_out": 4})
    code, err = replay_cli_error("--url", server.url, "--traces", str(folder))
    assert code == 2 and "the server's max_model_len is 100 tokens" in err and "--token-scale" in err


def test_a_named_command_registers_only_itself():
    """`loadgen replay` must not import what other commands need (bench: the server's flags)."""
    code = ("import sys; from loadgen.cli import build_parser; p = build_parser(['replay', '--help']); "
            "print(sorted(p._subparsers._group_actions[0].choices), 'server.args' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["['replay']", "False"]
    assert set(build_parser(["--help"])._subparsers._group_actions[0].choices) == set(COMMAND_MODULES)


def test_every_commands_help_loads_neither_numpy_nor_torch():
    """The parser of every command is built for `loadgen --help`: none may load the heavy packages."""
    code = ("import sys; from loadgen.cli import build_parser; build_parser(['--help']); "
            "print(sorted({'numpy', 'torch'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def test_a_reader_that_leaves_the_pipe_gets_no_traceback():
    # as `loadgen golden-al pins | head -1` once head has gone: stdout a pipe whose reader is closed
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "golden-al", "pins"], cwd=ROOT,
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.close(write_end)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr
