"""`loadgen traces stats` end to end in a subprocess, its errors, and the torch-free import rule."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]


def _loadgen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadgen.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_stats_table_on_the_bundled_set() -> None:
    out = _loadgen("traces", "stats")
    assert out.returncode == 0, out.stderr
    assert "agentic-coding" in out.stdout and "7 with subagents" in out.stdout
    assert "prefix-cache hit rate" in out.stdout and "think time (s)" in out.stdout


def test_stats_json_with_scaling_on_a_file(session_file: Path) -> None:
    out = _loadgen("traces", "stats", str(session_file), "--json", "--max-context", "14",
                   "--think-time-cap", "1")
    assert out.returncode == 0, out.stderr
    stats = orjson.loads(out.stdout)
    assert (stats["sessions"], stats["requests"], stats["think_time"]["max"]) == (1, 2, 1.0)
    assert stats["scale"]["dropped"] == 3 and stats["scale"]["config"]["max_context"] == 14


def test_stats_forced_mooncake(files) -> None:
    path = files.jsonl("mc.jsonl", [{"timestamp": 0, "input_length": 1024, "output_length": 2, "hash_ids": [1, 2]},
                                    {"timestamp": 5, "input_length": 1100, "output_length": 2, "hash_ids": [1, 2, 3]}])
    out = _loadgen("traces", "stats", str(path), "--format", "mooncake", "--json")
    assert out.returncode == 0, out.stderr
    stats = orjson.loads(out.stdout)
    assert (stats["format"], stats["block_size"], stats["requests"]) == ("mooncake", 512, 2)
    assert stats["hit_rate"] == 1024 / 2124


def test_stats_errors_exit_2_with_a_clear_message(tmp_path: Path, files) -> None:
    missing = _loadgen("traces", "stats", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "nowhere: no such file, directory or bundled trace set" in missing.stderr
    assert "Traceback" not in missing.stderr
    broken = files.json("broken.json", {"requests": [{"out": 1}]})
    bad = _loadgen("traces", "stats", str(broken))
    assert bad.returncode == 2 and "broken.json: requests[0]: field 'in': missing" in bad.stderr
    knob = _loadgen("traces", "stats", "--token-scale", "0")
    assert knob.returncode == 2 and "token_scale must be > 0" in knob.stderr


def test_stats_refuses_hash_ids_shorter_than_the_input(files) -> None:
    short = files.json("short.json", {"block_size": 4, "requests": [
        {"in": 8, "out": 1, "hash_ids": [1, 2]}, {"in": 12, "out": 1, "hash_ids": [1, 2]}]})
    out = _loadgen("traces", "stats", str(short))
    assert out.returncode == 2, out.stdout
    assert "short.json: requests[1]: field 'hash_ids': 2 ids but the input (12 tokens) has 3 full blocks" in out.stderr
    assert "Traceback" not in out.stderr


def test_traces_and_the_command_import_without_torch_and_only_numpy_orjson() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "before = {n.split('.')[0] for n in sys.modules}\n"
        "import traces, loadgen.cli.traces\n"
        "from traces import PromptSynth, ScaleConfig, load_traces, scale_traces, trace_stats\n"
        "ts = load_traces('agentic-coding'); trace_stats(*scale_traces(ts, ScaleConfig(token_scale=0.5)))\n"
        "PromptSynth(64).prompt(ts.sessions[0].id, ts.sessions[0].requests[0], salt=1)\n"
        "new = {n.split('.')[0] for n in sys.modules} - before - set(sys.stdlib_module_names)\n"
        "assert new <= {'numpy', 'orjson', 'traces', 'loadgen'}, new\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
