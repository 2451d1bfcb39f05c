"""loadgen replay and bench against our speculative tiny server: the per-request golden AL travels
as `acceptance_length`, thinking and plain requests each reach their own AL, the measured AL
(from usage.spec_decode) sits beside the expected one in results and table, and flags that do not
fit the server are refused."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from loadgen.cli import main
from tests.server.conftest import API_KEY, REPO, ServerProcess, start_server

pytestmark = pytest.mark.slow  # tens of seconds: scheduled first (tests/conftest.py)

SPEC = '{"method": "mtp", "num_speculative_tokens": 3}'
AL_ON, AL_OFF = 2.49, 2.97  # dsv4_mtp at k=3


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # --max-model-len after TINY's: argparse keeps the last value.
    proc = start_server(tmp_path_factory, "spec_replay", ["--max-model-len", "2048", "--speculative-config", SPEC,
                                                          "--golden-al", "dsv4_mtp", "--thinking", "on"])
    yield proc
    proc.stop()


def _replay(tmp_path: Path, url: str, *flags: str, name: str = "run") -> tuple[int, dict, list[dict]]:
    out = tmp_path / name
    code = main(["replay", "--url", url, "--out", str(out), "--per-request", str(out / "req.jsonl"), *flags])
    doc = orjson.loads((out / "result.json").read_bytes()) if (out / "result.json").exists() else {}
    records = [json.loads(line) for line in (out / "req.jsonl").read_text().splitlines()] \
        if (out / "req.jsonl").exists() else []
    return code, doc, records


def _long_sessions(folder: Path, n_out: int) -> Path:
    """Four sessions of three requests with long outputs; sessions 0 and 2 think, 1 and 3 do not."""
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(4):
        items = [{"t": i * 0.1, "type": "n", "model": "m", "in": 128 + 64 * i, "out": n_out,
                  "hash_ids": list(range(1, 3 + i)), "think_time": 0.0, "api_time": 0.1,
                  "input_types": ["text"], "output_types": ["thinking", "text"] if s % 2 == 0 else ["text"]}
                 for i in range(3)]
        doc = {"id": f"s{s}", "models": ["m"], "block_size": 64, "hash_id_scope": "local",
               "tool_tokens": 0, "system_tokens": 0, "requests": items}
        with gzip.open(folder / f"s{s}.json.gz", "wt") as handle:
            json.dump(doc, handle)
    return folder


def _al(records: list[dict]) -> float:
    drafts = sum(r["spec_num_drafts"] for r in records)
    return (drafts + sum(r["spec_num_accepted_tokens"] for r in records)) / drafts


def test_thinking_and_plain_requests_reach_their_own_golden_al(spec_server, tmp_path):
    traces = _long_sessions(tmp_path / "traces", n_out=200)
    # Every replay window here (seconds) is sized so that a 2-core CI machine shared with other test
    # workers (requests up to ~3x slower than alone) still completes several requests in it.
    code, doc, records = _replay(tmp_path, spec_server.url, "--traces", str(traces), "--conc", "2",
                                 "--duration", "12", "--warmup", "0s", "--token-scale", "1", "--quiet",
                                 "--golden-al", "dsv4_mtp", "--spec-k", "3", "--thinking", "auto")
    assert code == 0
    done = [r for r in records if r["error"] is None]
    assert all(r["expected_al"] == (AL_ON if r["thinking"] else AL_OFF) for r in done)
    thinking = [r for r in done if r["thinking"]]
    plain = [r for r in done if not r["thinking"]]
    assert thinking and plain
    # The server's default is thinking_on (2.49): plain requests reach 2.97 only through the override.
    assert _al(thinking) == pytest.approx(AL_ON, rel=0.05)
    assert _al(plain) == pytest.approx(AL_OFF, rel=0.05)
    spec = doc["levels"][0]["spec_decode"]
    assert spec["measured_from"] == "usage" and spec["k"] == 3
    assert AL_ON <= spec["expected_al"] <= AL_OFF
    assert spec["measured_al"] == pytest.approx(spec["expected_al"], rel=0.04)
    assert doc["config"]["spec_decode"]["sent_per_request"] is True


def test_bundled_traces_report_measured_beside_golden(spec_server, tmp_path, capsys):
    code, doc, records = _replay(tmp_path, spec_server.url, "--token-scale", "0.02", "--think-time-scale", "0.01",
                                 "--duration", "10", "--conc", "2", "--golden-al", "dsv4_mtp", "--spec-k", "3")
    assert code == 0
    table = capsys.readouterr().out
    (level,) = doc["levels"]
    spec = level["spec_decode"]
    assert level["counts"]["errors_total"] == 0 and level["counts"]["requests_ok"] > 0
    assert spec["measured_from"] == "usage" and spec["requests_with_usage"] == level["counts"]["requests_ok"]
    assert f"acceptance length measured {spec['measured_al']:.3f} (from usage) | golden {spec['expected_al']:.3f} " \
           f"(k=3, dsv4_mtp)" in table
    assert all(r["expected_al"] == (AL_ON if r["thinking"] else AL_OFF) for r in records)
    assert all(r["spec_num_drafts"] is not None for r in records if r["error"] is None)


def test_flags_that_do_not_fit_our_server_are_refused(spec_server, server, tmp_path, capsys):
    code, _, _ = _replay(tmp_path, spec_server.url, "--golden-al", "dsv4_mtp", "--spec-k", "5", "--quiet", name="k5")
    assert code == 2
    assert "--spec-k: 5, but the server runs num_speculative_tokens=3" in capsys.readouterr().err
    code, _, _ = _replay(tmp_path, server.url, "--api-key", API_KEY, "--golden-al", "dsv4_mtp", "--spec-k", "3",
                         "--quiet", name="plain")
    assert code == 2
    assert "does not run synthetic speculative decoding" in capsys.readouterr().err


def test_bench_with_speculative_engine_reports_measured_al_beside_golden(tmp_path):
    folder = _long_sessions(tmp_path / "traces", n_out=60)
    out = tmp_path / "bench"
    done = subprocess.run(
        [sys.executable, "-m", "loadgen.cli", "bench", "--model", "tiny", "--device", "cpu", "--max-model-len", "2048",
         "--speculative-config", SPEC, "--golden-al", "dsv4_mtp", "--thinking", "off", "--traces", str(folder),
         "--conc", "2", "--duration", "8", "--warmup", "0s", "--token-scale", "1", "--think-time-scale", "1",
         "--out", str(out), "--no-report"],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    doc = orjson.loads((out / "result.json").read_bytes())
    spec = doc["levels"][0]["spec_decode"]
    assert spec["k"] == 3 and spec["golden_al"] == "server default" and spec["expected_al"] == AL_OFF
    assert spec["measured_from"] == "usage" and spec["measured_al"] == pytest.approx(AL_OFF, rel=0.1)
    assert "speculative decoding: acceptance length measured" in done.stdout
    assert doc["config"]["spec_decode"]["sent_per_request"] is False
