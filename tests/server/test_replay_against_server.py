"""`loadgen replay --url` against `server start --model tiny` with scaled bundled traces: the two
halves work together with zero errors, and the server's counts agree with the client's; the launch
our server reports lets `loadgen recipe verify` check a plain replay's server."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson

from tests.server.conftest import API_KEY, REPO


def test_replay_bundled_traces_against_our_server(fresh_server, tmp_path):
    out = tmp_path / "replay"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "loadgen.cli", "replay", "--url", fresh_server.url,
         "--max-context", "1024", "--token-scale", "0.02", "--think-time-scale", "0.01",
         "--duration", "4", "--conc", "2", "--out", str(out), "--quiet"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr
    result = orjson.loads((out / "result.json").read_bytes())
    (level,) = result["levels"]
    counts = level["counts"]
    assert not level["failed"], level["fail_reasons"]
    assert counts["errors_total"] == 0 and counts["errors"] == {}
    assert counts["requests_ok"] > 0
    assert counts["usage_mismatch_requests"] == 0  # streamed token ids match usage exactly
    assert fresh_server.proc.poll() is None, fresh_server.log()


def test_a_plain_replay_against_our_server_is_verified_against_a_recipe(server, tmp_path, capsys):
    """Our server reports how it was started, so a plain `loadgen replay` (no recipe run) records it and
    `loadgen recipe verify` checks it flag by flag: the recipe that matches passes, one with another flag
    value and an environment variable the server ran without is named. The key is never recorded."""
    import yaml

    from loadgen.cli import main
    from loadgen.recipe.runner import load_command
    from loadgen.recipe.schema import recipe_from_dict

    flags = {"model": "tiny", "device": "cpu", "max_model_len": 1024, "kv_cache_gb": 0.0005, "max_num_seqs": 16,
             "max_num_batched_tokens": 256, "max_body_mb": 1, "api_key": API_KEY}
    recipe = {"name": "plain", "server": {"kind": "ours", "flags": flags},
              "workload": {"max_context": 512, "token_scale": 0.02, "think_time_scale": 0.01},
              "sweep": {"conc": [2], "duration_s": 2, "repeats": 1}, "variants": [{"name": "a"}]}
    matching = recipe_from_dict(recipe)
    out = tmp_path / "replay"
    command = load_command(matching, matching.baseline, server.url, out, True) + ["--api-key", API_KEY]
    done = subprocess.run(command, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
                          text=True, timeout=240)
    text = (out / "result.json").read_text()
    assert done.returncode == 0, orjson.loads(text)["levels"][0]["fail_reasons"]
    assert API_KEY not in text
    launch = orjson.loads(text)["launch"]["server"]
    assert launch["kind"] == "ours" and launch["argv"][:4] == [sys.executable, "-m", "server.cli", "start"]
    assert launch["argv_unknown"] is None and "torch" in launch["versions"]["packages"]
    paths = {}
    changed = {**recipe, "server": {"kind": "ours", "flags": {**flags, "max_num_seqs": 8},
                                    "env": {"AGENTLOAD_LOG_LEVEL": "DEBUG"}}}
    for name, doc in (("matching", recipe), ("changed", changed)):
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(doc))
    assert main(["recipe", "verify", str(paths["matching"]), str(out)]) == 0
    assert "matches the recipe" in capsys.readouterr().out
    assert main(["recipe", "verify", str(paths["changed"]), str(out)]) == 1
    found = capsys.readouterr().out
    assert "server flag --max-num-seqs: the recipe gives '8', the run had '16'" in found
    assert "environment AGENTLOAD_LOG_LEVEL: the recipe sets 'DEBUG', the run had None" in found
    assert "2 contradictions" in found
