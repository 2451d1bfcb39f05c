"""InferenceX's ingest rules, restated from its code (tests/loadgen/infx_ingest.py), applied to our rows
of both shapes from a real CPU run and from a GPU-like fixture (the same run with the GPU telemetry
an H100 host records): no row is skipped, each is filed under the identity given or measured, and
every statistic the ingest stores equals InferenceX's formula on the same per-request data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from loadgen.cli import main
from loadgen.results.file import write_results
from tests.loadgen.infx_ingest import agentic_stats, fixed_stats, ingest

IDENTITY = ("--framework", "vllm", "--precision", "fp8", "--model-prefix", "dsv4")
H100 = "NVIDIA H100 80GB HBM3"
GPUS = 8
_RUNS: dict[str, Path] = {}


@pytest.fixture
def runs(start_server, sessions, replay, tmp_path_factory) -> dict[str, Path]:
    """`cpu`: a 2-level sweep against a streaming server on this machine (no GPU telemetry); `gpu`: the
    same results with the telemetry of 8 H100s; `per_request`: the run's per-request file."""
    if not _RUNS:
        folder = sessions(*({"n_requests": 3, "think": 0.0, "n_out": 6} for _ in range(6)))
        server = start_server(first_ms=12, itl_ms=3.0)
        code, doc, records = replay(server.url, "--traces", str(folder), "--conc", "1,3", "--duration", "1.5",
                                    "--gpus", str(GPUS), "--gpu-telemetry", "off")
        assert code == 0
        root = tmp_path_factory.mktemp("ingest")
        _RUNS["cpu"] = write_results(root / "cpu" / "result.json", doc)
        for level in doc["levels"]:
            level["gpu"] = {"gpus": [{"index": i, "name": H100} for i in range(GPUS)]}
        _RUNS["gpu"] = write_results(root / "gpu" / "result.json", doc)
        _RUNS["per_request"] = root / "requests.jsonl"
        _RUNS["per_request"].write_text("".join(json.dumps(record) + "\n" for record in records))
    return _RUNS


def _rows(capsys, tmp_path: Path, result: Path, shape: str, *flags: str) -> list[dict]:
    code = main(["report", str(result), "--format", shape, "--out", str(tmp_path), *IDENTITY, *flags])
    assert code == 0, capsys.readouterr().err
    return json.loads((tmp_path / f"{shape}.json").read_text())


def _chunk_gaps(per_request: Path, level: dict) -> np.ndarray:
    records = [json.loads(line) for line in per_request.read_text().splitlines()]
    counted = [r for r in records if r["counted"] and r["level"] == level["label"]]
    return np.concatenate([np.diff(r["chunk_ns"]) for r in counted]) / 1e9


def _same(stored: dict[str, float], expected: dict[str, float], derived_intvty: bool) -> None:
    """Rows carry 5 decimals; an interactivity the ingest derives as 1 / a rounded ITL moves with it."""
    for key, exact in expected.items():
        assert key in stored, f"{key}: not stored"
        if derived_intvty and key.endswith("_intvty") and not key.startswith("std"):
            assert stored[key] == pytest.approx(exact, rel=6e-6 * exact + 1e-9), key
        else:
            assert stored[key] == pytest.approx(exact, abs=6e-6, rel=1e-9), key


@pytest.mark.parametrize(("source", "flags", "hardware"), [("cpu", ("--hw", "h200"), "h200"), ("gpu", (), "h100")])
def test_agentx_rows_are_ingested_whole(runs, capsys, tmp_path, source, flags, hardware):
    rows = _rows(capsys, tmp_path, runs[source], "agentx", *flags)
    levels = json.loads(runs[source].read_text())["levels"]
    assert len(rows) == len(levels) == 2
    for row, level in zip(rows, levels):
        point = ingest(row)
        assert isinstance(point, dict), point
        assert (point["model"], point["hardware"], point["type"], point["conc"]) == \
            ("dsv4", hardware, "agentic_traces", level["concurrency"])
        _same(point["metrics"], agentic_stats(level, GPUS), derived_intvty=True)


@pytest.mark.parametrize(("source", "flags", "hardware"), [("cpu", ("--hw", "h200"), "h200"), ("gpu", (), "h100")])
def test_fixed_sequence_rows_are_ingested_whole(runs, capsys, tmp_path, source, flags, hardware):
    rows = _rows(capsys, tmp_path, runs[source], "infx", "--isl", "300", "--osl", "6", "--per-request",
                 str(runs["per_request"]), *flags)
    levels = json.loads(runs[source].read_text())["levels"]
    assert len(rows) == len(levels) == 2
    for row, level in zip(rows, levels):
        point = ingest(row)
        assert isinstance(point, dict), point
        assert (point["hardware"], point["type"], point["isl"], point["osl"], point["conc"]) == \
            (hardware, "single_turn", 300, 6, level["concurrency"])
        _same(point["metrics"], fixed_stats(level, _chunk_gaps(runs["per_request"], level), GPUS),
              derived_intvty=False)


def test_the_ingest_restatement_skips_what_upstream_skips():
    """The restated rules are not a pass-through: each reason InferenceX's mapper drops a row."""
    row = {"hw": "h100", "infmax_model_prefix": "dsv4", "conc": 4, "isl": 1024, "osl": 1024,
           "num_requests_total": 3, "num_requests_successful": 3, "mean_ttft": 0.5}
    assert isinstance(ingest(row), dict)
    assert ingest({**row, "infmax_model_prefix": "tiny"}) == "unmapped model 'tiny'"
    assert ingest({**row, "infmax_model_prefix": "dsv4-fp4"})["model"] == "dsv4"  # precision suffix stripped
    assert ingest({**row, "hw": "a100"}) == "unmapped hw 'a100'"
    assert ingest({**row, "hw": "cluster:b300-nv"})["hardware"] == "b300"
    assert ingest({**row, "isl": None}) == "no isl/osl/conc"
    assert ingest({**row, "num_requests_successful": 0}) == "failed run (no successful request)"
    agentic = {**row, "scenario_type": "agentic-coding", "request_metrics": {"latency": {"itl": {"p50": 0.004}}},
               "p90_intvty": 99.0}
    point = ingest(agentic)
    assert point["metrics"]["median_intvty"] == pytest.approx(250) and "p90_intvty" not in point["metrics"]
