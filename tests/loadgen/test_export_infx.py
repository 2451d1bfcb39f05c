"""`loadgen report --format infx|agentx` on results of the real replay pipeline: rows valid against
the JSON Schemas written from InferenceX's ingest, shaped like the checked-in example rows, with
InferenceX's statistics recomputed here from the request columns (throughput over the requests'
span, ITL from the --per-request file's chunks); identity flags and errors (hardware from the GPUs
measured, model prefixes InferenceX knows, lengths near the nominal ones); where the files go."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from loadgen.cli import main
from loadgen.export.infx_identity import ExportError, IdentityFlags, gpu_key_of_name, model_key, resolve_identity
from loadgen.results.file import write_results

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "loadgen" / "schemas"
EXAMPLES = Path(__file__).with_name("data")
IDENTITY = ("--hw", "h200", "--framework", "vllm", "--precision", "fp8", "--model-prefix", "dsv4")
H100 = "NVIDIA H100 80GB HBM3"  # as NVML, DCGM and torch name it
_RUN: dict[str, Path] = {}


def _validator(shape: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / f"{shape}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _example(shape: str) -> dict:
    return json.loads((EXAMPLES / f"{shape}_example_row.json").read_text())


@pytest.fixture
def result(start_server, sessions, replay, tmp_path_factory) -> Path:
    """A 2-level sweep (conc 1, 3) whose sessions grow their input (so ISL varies) and ask 6 tokens;
    no GPU telemetry (the rows' hardware is the flag's on any machine); its per-request file beside it."""
    if not _RUN:
        folder = sessions(*({"n_requests": 3, "think": 0.0, "n_out": 6} for _ in range(6)))
        server = start_server(first_ms=15, itl_ms=4.0)
        code, doc, records = replay(server.url, "--traces", str(folder), "--conc", "1,3", "--duration", "1.2",
                                    "--gpus", "8", "--gpu-telemetry", "off")
        assert code == 0
        folder = tmp_path_factory.mktemp("infx")
        _RUN["path"] = write_results(folder / "result.json", doc)
        _RUN["per_request"] = folder / "requests.jsonl"
        _RUN["per_request"].write_text("".join(json.dumps(record) + "\n" for record in records))
    return _RUN["path"]


def _report(capsys, *args) -> tuple[int, str, str]:
    code = main(["report", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def _rows(capsys, tmp_path, result, shape, *flags, identity=IDENTITY) -> list[dict]:
    code, out, err = _report(capsys, result, "--format", shape, "--out", tmp_path, *identity, *flags)
    assert code == 0, err
    assert f"wrote {tmp_path / f'{shape}.json'}" in out
    return json.loads((tmp_path / f"{shape}.json").read_text())


def _span(level: dict) -> float:
    """InferenceX's throughput duration: the counted requests' last end - first start, seconds."""
    starts = np.asarray(level["requests"]["start_ms"]) / 1e3
    return float((starts + np.asarray(level["requests"]["e2el_us"]) / 1e6).max() - starts.min())


def _same_shape(row, example, where=""):
    """Every key of the example is in the row with the same JSON type (null stands for any); maps
    keyed by data (error categories) and our own provenance are not compared."""
    for key, value in example.items():
        if key in ("agentload", "error_categories"):
            continue
        assert key in row, f"{where}{key}"
        if isinstance(value, dict) and value:
            _same_shape(row[key], value, f"{where}{key}.")
        elif value is not None and row[key] is not None:
            number = (int, float)
            same = isinstance(row[key], number) if isinstance(value, number) and not isinstance(value, bool) \
                else type(row[key]) is type(value)
            assert same, f"{where}{key}: {row[key]!r} vs example {value!r}"


def _check_rows(rows: list[dict], shape: str) -> None:
    """One row per level, each valid against the schema and shaped like the example row."""
    assert [row["conc"] for row in rows] == [1, 3]
    validator = _validator(shape)
    for row in rows:
        validator.validate(row)
        _same_shape(row, _example(shape))


def test_examples_follow_the_schemas():
    for shape in ("infx", "agentx"):
        _validator(shape).validate(_example(shape))


def test_infx_rows_validate_and_carry_inferencex_statistics(result, capsys, tmp_path):
    rows = _rows(capsys, tmp_path, result, "infx", "--isl", "300", "--osl", "6", "--tp", "4", "--pp", "2")
    _check_rows(rows, "infx")
    row, level = rows[0], json.loads(result.read_text())["levels"][0]
    columns, counts = level["requests"], level["counts"]
    assert ((row["tp"], row["pp"], row["isl"], row["osl"], row["hw"], row["dp_attention"])
            == (4, 2, 300, 6, "h200", "false"))
    assert row["num_requests_successful"] == counts["requests_ok"] == len(columns["ttft_us"])
    ttft = np.asarray(columns["ttft_us"]) / 1e6
    assert row["median_ttft"] == pytest.approx(np.percentile(ttft, 50))
    assert row["p99.9_ttft"] == pytest.approx(np.percentile(ttft, 99.9))
    assert row["std_ttft"] == pytest.approx(ttft.std())  # population std, as numpy's default
    assert 0.015 <= row["median_ttft"] < 1.0  # the server waits 15 ms before the first token
    tpot = np.asarray([v for v in columns["tpot_us"] if v]) / 1e6
    assert row["p90_tpot"] == pytest.approx(np.percentile(tpot, 90))
    for stat in ("mean", "median", "std", "p90", "p99", "p99.9"):
        assert row[f"{stat}_intvty"] == pytest.approx(1 / row[f"{stat}_tpot"])  # InferenceX: every tpot key
    itl = level["metrics"]["itl"]["stats"]  # per chunk, from the HDR histogram without a --per-request file
    assert row["p99_itl"] == pytest.approx(itl["p99"] / 1e6) and row["median_itl"] == pytest.approx(itl["p50"] / 1e6)
    assert row["agentload"]["itl_from"] == "hdr_histogram"
    gpus = 4 * 2  # tp x pp x pcp_size
    tokens = sum(columns["isl"]) + sum(columns["osl"])
    assert tokens == counts["input_tokens"] + counts["output_tokens"]
    # InferenceX's rate: over the requests' span, not our window (which the results file keeps)
    assert row["tput_per_gpu"] == pytest.approx(tokens / _span(level) / gpus)
    assert row["tput_per_gpu"] != pytest.approx(tokens / level["window_s"] / gpus)
    assert row["output_tput_per_gpu"] == pytest.approx(sum(columns["osl"]) / _span(level) / gpus)
    assert row["agentload"]["span_s"] == pytest.approx(_span(level)) and row["agentload"]["window_s"] == 1.2
    assert row["agentload"]["label"] == "conc 1" and row["agentload"]["e2e_intvty"] > 0
    assert "failed" not in row and "run" not in row and "label" not in row  # never read as numbers at ingest


def test_agentx_rows_validate_and_nest_per_request_itl(result, capsys, tmp_path):
    rows = _rows(capsys, tmp_path, result, "agentx")
    _check_rows(rows, "agentx")
    row, level = rows[1], json.loads(result.read_text())["levels"][1]
    columns = level["requests"]
    assert row["scenario_type"] == "agentic-coding" and "isl" not in row and "osl" not in row
    assert row["tp"] == 8  # the run's 8 GPUs / (pp x pcp_size)
    latency = row["request_metrics"]["latency"]
    itl = np.asarray([v for v in columns["tpot_us"] if v]) / 1e6  # per request: (E2EL - TTFT) / (OSL - 1)
    assert latency["itl"]["p75"] == pytest.approx(np.percentile(itl, 75), abs=1e-5)
    assert latency["itl"] == latency["tpot"]
    # slow tail; itl p90 (~4 ms) is rounded to 5 decimals, which moves its reciprocal by up to ~0.13 %
    assert latency["intvty"]["p90"] == pytest.approx(1 / latency["itl"]["p90"], rel=3e-3)
    assert latency["intvty"]["std"] == pytest.approx((1 / itl).std(), abs=1e-4)
    per_token = np.asarray(columns["e2el_us"]) / 1e6 / np.asarray(columns["osl"])
    assert latency["e2e_norm_intvty"]["p50"] == pytest.approx(1 / np.percentile(per_token, 50), rel=1e-3)
    counts = level["counts"]
    accounting = row["request_accounting"]
    assert accounting["records_profiled"] == row["num_requests_successful"] == counts["requests_ok"]
    assert accounting["records_total"] == counts["requests_ok"] + counts["errors_total"] + counts["warmup_requests_ok"]
    assert row["num_requests_total"] == accounting["records_total"]
    throughput = row["request_metrics"]["throughput"]
    assert throughput["duration_seconds"] == pytest.approx(_span(level), abs=1e-5)  # max(end) - min(start)
    assert throughput["per_gpu"]["output_tput_tps"] == pytest.approx(sum(columns["osl"]) / _span(level) / 8, abs=1e-4)
    assert throughput["input"]["tokens_per_second"] == pytest.approx(sum(columns["isl"]) / _span(level), abs=1e-4)


def test_failed_levels_are_left_out(result, capsys, tmp_path):
    doc = json.loads(result.read_text())
    doc["levels"][0].update(failed=True, fail_reasons=["error rate 50.0% > --max-error-rate 10.0%"])
    failed = write_results(tmp_path / "failed.json", doc)
    rows = _rows(capsys, tmp_path, failed, "agentx")
    assert [row["conc"] for row in rows] == [3]


@pytest.mark.parametrize(("flags", "message"), [
    (("--format", "agentx"), "--hw, --framework, --precision, --model-prefix required (its server is not ours; "
                             "the run recorded no GPU's name to take the hardware from; GPU telemetry: no GPU "
                             "telemetry: --gpu-telemetry off)"),
    (("--format", "infx", *IDENTITY), "--isl: the fixed-sequence shape needs one nominal ISL"),
    (("--format", "infx", *IDENTITY, "--isl", "8192", "--osl", "1024"),
     "conc 1: --isl 8192 but a mean ISL of "),
    (("--format", "infx", *IDENTITY, "--isl", "300", "--osl", "8"),
     "--osl 8 but a mean OSL of 6, more than 20% from the nominal length InferenceX would file the row under"),
    (("--format", "agentx", *IDENTITY, "--infx-dir", "report"), "--infx-dir report: InferenceX's ingest reads only"),
    (("--format", "infx", *IDENTITY, "--isl", "300", "--osl", "6", "--per-request", "a.jsonl", "--per-request",
      "b.jsonl"), "--per-request: one file per results file, in their order (1 results files, 2 per-request files)"),
    (("--format", "infx", *IDENTITY, "--isl", "300", "--osl", "6", "--per-request", "missing.jsonl"),
     "--per-request missing.jsonl: No such file or directory"),
    (("--format", "agentx", *IDENTITY, "--tp", "4", "--dcp-size", "3"), "--dcp-size 3 must divide the TP degree 4"),
    (("--format", "agentx", *IDENTITY, "--pp", "3"), "not a multiple of --pp x --pcp-size = 3"),
    (("--format", "agentx", *IDENTITY, "--ep", "0"), None),  # argparse: exit 2 before any report
])
def test_identity_errors_exit_2_and_write_nothing(result, capsys, tmp_path, flags, message):
    if message is None:
        with pytest.raises(SystemExit) as raised:
            main(["report", str(result), "--out", str(tmp_path / "out"), *flags])
        assert raised.value.code == 2
    else:
        code, _, err = _report(capsys, result, "--out", tmp_path / "out", *flags)
        assert code == 2 and message in err, err
    assert not (tmp_path / "out").exists()


def _our_run(num_gpus: int, speculative: dict | None = None, model: str = "dsv4", gpu_names=(H100,),
             **config) -> dict:
    """A results document of our server: its config, and one level whose GPU telemetry read these GPUs."""
    return {"config": {"model": model, "gpus": max(1, num_gpus), **config,
                       "server": {"ours": True, "num_gpus": num_gpus, "models_entry": {"speculative": speculative}}},
            "levels": [{"gpu": {"gpus": [{"index": i, "name": name} for i, name in enumerate(gpu_names)]}}]}


def _vllm_run(**config) -> dict:
    return {"config": {"model": "m", "gpus": 1, "server": {"ours": False}, **config}, "levels": []}


def test_our_server_fills_the_identity():
    identity = resolve_identity(IdentityFlags(), _our_run(2, {"method": "dspark"}), "r")
    assert (identity.hw, identity.framework, identity.precision, identity.infmax_model_prefix) == \
        ("h100", "agentload", "bf16", "dsv4")
    assert (identity.tp, identity.gpus, identity.spec_decoding) == (2, 2, "mtp")
    assert resolve_identity(IdentityFlags(), _our_run(1), "r").keys()["spec_decoding"] == "none"
    with pytest.raises(ExportError, match="--tp x --pp x --pcp-size = 4 GPUs, but our server ran on 2"):
        resolve_identity(IdentityFlags(tp=4), _our_run(2), "r")
    with pytest.raises(ExportError, match="run r served from CPU, which InferenceX has no hardware key for"):
        resolve_identity(IdentityFlags(), _our_run(0, gpu_names=()), "r")


def test_a_run_that_expected_a_golden_al_is_filed_as_speculating():
    flags = IdentityFlags(hw="h200", framework="vllm", precision="fp8", model_prefix="dsv4")
    assert resolve_identity(flags, _vllm_run(spec_decode={"k": 3, "golden_al": "dsv4_mtp"}), "r").spec_decoding \
        == "mtp"
    assert resolve_identity(flags, _vllm_run(spec_decode=None), "r").spec_decoding == "none"


def test_agentx_schema_takes_an_empty_block_but_not_a_partial_one():
    row = _example("agentx")
    validator = _validator("agentx")
    row["request_metrics"]["latency"]["itl"] = {}  # InferenceX writes {} when no request had the value
    validator.validate(row)
    row["request_metrics"]["latency"]["itl"] = {"mean": 0.01}
    assert not validator.is_valid(row)


def test_hardware_inferencex_does_not_know_is_warned(caplog):
    flags = IdentityFlags(hw="cpu-box", framework="vllm", precision="fp8", model_prefix="dsv4")
    with caplog.at_level("WARNING"):
        resolve_identity(flags, _vllm_run(), "r")
    assert "--hw cpu-box is not a GPU key InferenceX knows" in caplog.text


def test_schemas_and_exporter_share_the_gpu_keys():
    from loadgen.export.infx_identity import INFX_GPU_KEYS

    for shape in ("infx", "agentx"):
        pattern = json.loads((SCHEMAS / f"{shape}.schema.json").read_text())["properties"]["hw"]["pattern"]
        assert pattern == f"^({'|'.join(INFX_GPU_KEYS)})(-.*)?$"


def test_completions_within_one_second_give_inferencex_fallback_qps(result, capsys, tmp_path):
    doc = json.loads(result.read_text())
    columns = doc["levels"][1]["requests"]
    columns["start_ms"] = [i * 10.0 for i in range(len(columns["start_ms"]))]  # finishes within 1 s
    short = write_results(tmp_path / "short.json", doc)
    qps = _rows(capsys, tmp_path, short, "agentx")[1]["request_metrics"]["qps"]
    ends = np.asarray(columns["start_ms"]) / 1e3 + np.asarray(columns["e2el_us"]) / 1e6
    assert qps["samples"] == 0 and qps["window_seconds"] == 1
    assert qps["mean"] == pytest.approx(len(ends) / (ends.max() - ends.min()), rel=1e-4)


def test_model_prefixes_resolve_as_inferencex_ingest_resolves_them():
    """normalizers.ts resolvePrefixToKey: a model key, an alias, either with a precision suffix, any case."""
    assert [model_key(prefix) for prefix in ("dsv4", "DSR1-FP8", "gptoss", "kimik2.7-fp4", "qwen3.5-nvfp4-mtp",
                                             "dsv4pro", "minimaxm3")] == \
        ["dsv4", "dsr1", "gptoss120b", "kimik2.7-code", "qwen3.5", "dsv4", "minimaxm3"]
    assert [model_key(prefix) for prefix in ("v32", "tiny", "deepseek-v4-pro", "dsv4-bf16")] == [None] * 4


def test_a_served_model_name_inferencex_does_not_know_is_refused(caplog):
    """Our server's name is only a default prefix: one InferenceX maps to no model is refused (its ingest
    would drop every row); an explicit --model-prefix it does not know is warned about."""
    with pytest.raises(ExportError, match="the model prefix defaults to the served model's name 'v32', which "
                       "InferenceX's ingest maps to no model, so it would drop every row; pass --model-prefix "
                       r"\(one of dsr1, .*, dsv4, gptoss, dsv4pro, kimik2.7"):
        resolve_identity(IdentityFlags(), _our_run(1, model="v32"), "r")
    assert resolve_identity(IdentityFlags(model_prefix="dsv4-fp8"), _our_run(1, model="v32"), "r") \
        .keys()["infmax_model_prefix"] == "dsv4-fp8"
    with caplog.at_level("WARNING"):
        resolve_identity(IdentityFlags(model_prefix="newmodel"), _our_run(1, model="v32"), "r")
    assert "--model-prefix newmodel is no model InferenceX's ingest knows" in caplog.text


def test_our_server_run_exports_only_with_a_known_prefix_and_the_measured_gpu(result, capsys, tmp_path):
    """Against our server with no identity flags: the served name `tiny` is no InferenceX model, so
    nothing is written; with a prefix, the rows are filed under the GPU the run measured, not h200."""
    doc = json.loads(result.read_text())
    doc["config"]["model"] = "tiny"
    doc["config"]["server"].update(ours=True, num_gpus=8)
    doc["levels"][1]["gpu"]["gpus"] = [{"index": i, "name": H100} for i in range(8)]
    ours = write_results(tmp_path / "ours.json", doc)
    code, _, err = _report(capsys, ours, "--format", "agentx", "--out", tmp_path / "out")
    assert code == 2 and "'tiny', which InferenceX's ingest maps to no model" in err and "--model-prefix" in err
    assert not (tmp_path / "out").exists()
    rows = _rows(capsys, tmp_path, ours, "agentx", identity=("--model-prefix", "dsv4"))
    assert [(row["hw"], row["infmax_model_prefix"], row["framework"], row["tp"]) for row in rows] == \
        [("h100", "dsv4", "agentload", 8)] * 2


@pytest.mark.parametrize(("name", "key"), [
    (H100, "h100"), ("NVIDIA H100 PCIe", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA H200 NVL", "h200"),
    ("NVIDIA B200", "b200"), ("NVIDIA GB200", "gb200"), ("AMD Instinct MI300X", "mi300x"),
    ("AMD Instinct MI355X", "mi355x"), ("NVIDIA GH200 480GB", None), ("NVIDIA A100-SXM4-80GB", None),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_gpu_names_give_inferencex_gpu_keys(name, key):
    assert gpu_key_of_name(name) == key


def test_hardware_comes_from_what_the_run_measured(caplog):
    ours = IdentityFlags()
    assert resolve_identity(ours, _our_run(1, gpu_names=("NVIDIA B200",)), "r").hw == "b200"
    # the in-process engine names its device in the config and in its /v1/models card
    bench = _our_run(1, gpu_names=(), device="cuda", device_name="AMD Instinct MI355X")
    assert resolve_identity(ours, bench, "r").hw == "mi355x"
    # any server's run: its telemetry names the GPU, so --hw is not needed
    vllm = {**_vllm_run(), "levels": [{"gpu": {"gpus": [{"index": 0, "name": H100}]}}]}
    assert resolve_identity(IdentityFlags(framework="vllm", precision="fp8", model_prefix="dsv4"), vllm, "r").hw \
        == "h100"
    # a GPU whose exporter gives no name, and a run without telemetry: nothing to take the key from, no guess
    for unnamed in (_our_run(2, gpu_names=("unknown", "unknown")), _our_run(2, gpu_names=())):
        unnamed["config"]["gpu_telemetry"] = "no GPU telemetry: --gpu-telemetry off"
        with pytest.raises(ExportError, match=r"run r: --hw required \(the run recorded no GPU's name to take the "
                           "hardware from; GPU telemetry: no GPU telemetry: --gpu-telemetry off\\)"):
            resolve_identity(ours, unnamed, "r")
        assert resolve_identity(IdentityFlags(hw="b300-nv"), unnamed, "r").hw == "b300-nv"  # then the flag
    with pytest.raises(ExportError, match="run r measured NVIDIA A100-SXM4-80GB, a GPU InferenceX has no hardware "
                       "key for .*: its ingest would skip the rows; pass --hw only if"):
        resolve_identity(ours, _our_run(1, gpu_names=("NVIDIA A100-SXM4-80GB",)), "r")
    mixed = _our_run(2, gpu_names=(H100, "NVIDIA B200"))
    with pytest.raises(ExportError, match=f"measured several kinds of GPU \\(NVIDIA B200 -> b200, {H100} -> h100\\); "
                       "pass --hw naming the one"):
        resolve_identity(ours, mixed, "r")
    caplog.set_level("WARNING")
    assert resolve_identity(IdentityFlags(hw="b200"), mixed, "r").hw == "b200"  # picks one of those measured
    assert resolve_identity(IdentityFlags(hw="h100-nv"), _our_run(1), "r").hw == "h100-nv"  # a runner suffix
    assert not caplog.text
    # a flag that disagrees with what was measured wins (telemetry may have read the client's GPUs), warned
    assert resolve_identity(IdentityFlags(hw="h200"), _our_run(1), "r").hw == "h200"
    assert f"--hw h200 is not what run r measured ({H100} -> h100): its rows are filed under --hw" in caplog.text
    assert resolve_identity(IdentityFlags(hw="h200"), _our_run(0, gpu_names=()), "r").hw == "h200"
    assert "--hw h200 is not what run r measured (CPU)" in caplog.text


def test_itl_from_the_per_request_file_is_every_chunk_gap(result, capsys, tmp_path):
    """With the run's --per-request file, ITL is InferenceX's: the statistics of every gap between two
    chunks of the counted requests, exact, not the histogram's 3 significant digits."""
    rows = _rows(capsys, tmp_path, result, "infx", "--isl", "300", "--osl", "6", "--per-request",
                 _RUN["per_request"])
    records = [json.loads(line) for line in _RUN["per_request"].read_text().splitlines()]
    for row, level in zip(rows, json.loads(result.read_text())["levels"]):
        counted = [r for r in records if r["counted"] and r["level"] == level["label"]]
        assert len(counted) == level["counts"]["requests_ok"] == len(level["requests"]["ttft_us"])
        gaps = np.concatenate([np.diff(r["chunk_ns"]) for r in counted]) / 1e9
        assert gaps.size == level["metrics"]["itl"]["stats"]["count"]
        assert row["agentload"]["itl_from"] == "per_request_chunks"
        assert (row["mean_itl"], row["median_itl"], row["p99_itl"], row["std_itl"]) == pytest.approx(
            (gaps.mean(), np.median(gaps), np.percentile(gaps, 99), gaps.std()))


def test_a_per_request_file_of_another_run_is_refused(result, capsys, tmp_path):
    records = [json.loads(line) for line in _RUN["per_request"].read_text().splitlines()]
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({**r, "turn": r["turn"] + 1}) + "\n" for r in records))
    code, _, err = _report(capsys, result, "--format", "infx", "--out", tmp_path / "out", *IDENTITY, "--isl", "300",
                           "--osl", "6", "--per-request", other)
    assert code == 2 and f"--per-request {other}: its counted requests of conc 1 are not those of run" in err
    assert not (tmp_path / "out").exists()


def test_rows_go_where_inferencex_ingest_reads_them(result, capsys, tmp_path):
    """The ingest reads the *.json directly inside bmk_*/results_* folders of its artifacts root: the
    report says so when --out is no such folder, and --infx-dir writes into one."""
    code, out, err = _report(capsys, result, "--format", "agentx,csv", "--out", tmp_path / "out", *IDENTITY)
    assert code == 0, err
    assert f"wrote {tmp_path / 'out' / 'agentx.json'}" in out
    assert ("InferenceX's ingest reads only the *.json directly inside bmk_* and results_* folders of its artifacts "
            "root, and out/ is none: put agentx.json in such a folder (a workflow artifact named bmk_agentload, or "
            "INGEST_ARTIFACTS_PATH/bmk_agentload/), or write them there with --infx-dir") in out
    chosen = tmp_path / "artifacts" / "results_h100_dsv4"
    code, out, err = _report(capsys, result, "--format", "infx,agentx", "--out", tmp_path / "out2", *IDENTITY,
                             "--isl", "300", "--osl", "6", "--infx-dir", chosen)
    assert code == 0, err
    assert f"wrote {chosen / 'infx.json'}" in out and f"wrote {chosen / 'agentx.json'}" in out
    assert "InferenceX's ingest reads results_h100_dsv4/*.json when the folder sits in its artifacts root" in out
    assert sorted(path.name for path in chosen.iterdir()) == ["agentx.json", "infx.json"]
    assert not (tmp_path / "out2").exists()  # nothing else was asked for


# ---- server_metrics: InferenceX's block, from the level's /metrics series -------------------------------------------


def _absent(counts: dict) -> dict:
    """InferenceX's block when nothing was scraped: every value null, the token totals from the requests."""
    return {
        "present": False, "adapter": "none", "metric_count": 0,
        "cache": {**dict.fromkeys(("gpu_cache_hit_rate", "cpu_cache_hit_rate", "external_cache_hit_rate",
                                   "overall_cache_hit_rate", "prefix_cache_hits", "prefix_cache_queries",
                                   "external_prefix_cache_hits", "external_prefix_cache_queries")),
                  "cached_tokens_by_source": {},
                  **dict.fromkeys(("frontend_cache_hit_rate", "router_kv_hit_rate", "router_shared_cache_hit_rate",
                                   "frontend_cached_tokens", "frontend_input_tokens"))},
        "kv_cache": dict.fromkeys(("gpu_usage_pct", "gpu_total_tokens", "cpu_usage_pct", "cpu_used_tokens",
                                   "cpu_total_tokens")),
        "kv_offload": dict.fromkeys(("bytes_gpu_to_cpu", "bytes_cpu_to_gpu", "time_gpu_to_cpu", "time_cpu_to_gpu",
                                     "bandwidth_gpu_to_cpu_bytes_per_second",
                                     "bandwidth_cpu_to_gpu_bytes_per_second")),
        "tokens": {"prompt_total": counts["input_tokens"], "generation_total": counts["output_tokens"],
                   "requests_completed": counts["requests_ok"],
                   "prompt_by_source": {"gpu_cache_hit": None, "cpu_or_external_cache_hit": None, "computed": None,
                                        "raw": {}}},
        "sources": [],
    }


def _with(block: dict, **parts: dict) -> dict:
    """The block with some of its parts' keys replaced."""
    return {**block, **{key: {**block[key], **part} if isinstance(block[key], dict) else part
                        for key, part in parts.items()}}


def test_agentx_server_metrics_from_a_real_scrape(start_server, sessions, replay, capsys, tmp_path):
    """Our server's names (spec decoding, kernel compiles) read through vLLM's adapter: present, and
    what it lacks (prefix cache, KV cache, token counters) null or taken from the requests."""
    folder = sessions(*({"n_requests": 3, "think": 0.0, "n_out": 6} for _ in range(6)))
    server = start_server(first_ms=15, itl_ms=4.0, kernel_compiles=1, spec_metrics=[3, 4])
    code, doc, _ = replay(server.url, "--traces", str(folder), "--conc", "1,3", "--duration", "1.2",
                          "--server-metrics-interval", "0.2")
    assert code == 0
    rows = _rows(capsys, tmp_path, write_results(tmp_path / "scraped.json", doc), "agentx")
    _check_rows(rows, "agentx")
    for row, level in zip(rows, doc["levels"]):
        assert level["server_metrics"]["scrapes"] and level["server_metrics"]["adapter"] == "ours"
        assert row["server_metrics"] == _with(_absent(level["counts"]), present=True, adapter="vllm", metric_count=3)
        assert row["kv_cache_pool_tokens"] is None


def test_agentx_server_metrics_carry_the_window(result, capsys, tmp_path):
    doc = json.loads(result.read_text())
    vllm, sglang = doc["levels"]
    window_s = sglang["window_s"]
    vllm["server_metrics"] = {
        "interval_s": 1.0, "adapter": "vllm", "metric_count": 42, "scrapes": 3, "failed_scrapes": 0, "errors": [],
        "series": {"t_s": [-0.5, 0.5, window_s + 0.2], "kv_cache_usage": [0.1, 0.625, 0.2]},
        "window": {"kv_cache_usage": {"mean": 0.625, "max": 0.625}, "kv_offload_usage": {"mean": 0.2, "max": 0.25},
                   "prefix_cache_queries": 8000.0, "prefix_cache_hits": 6000.0, "kv_offload_queries": 2000.0,
                   "kv_offload_hits": 500.0, "kv_offload_store_bytes": 4e9, "kv_offload_load_bytes": 1e9,
                   "kv_offload_store_seconds": 2.0, "kv_offload_load_seconds": 0.5, "prompt_tokens": 8000.0,
                   "generation_tokens": 190.0, "prefix_cache_hit_rate": 0.75},
        # vLLM's pool in tokens is in its log, not its metrics (blocks x block size misses hybrid models)
        "raw_first": {'vllm:cache_config_info{block_size="16",num_gpu_blocks="75086"}': 1.0}, "raw_last": None,
    }
    pool = 'sglang:max_total_num_tokens{dp_rank="%d"}'
    sglang["server_metrics"] = {
        "interval_s": 0.5, "adapter": "sglang", "metric_count": 60, "scrapes": 4, "failed_scrapes": 0, "errors": [],
        # HiCache's host pool: a gauge, read over the window's scrapes (not the warm-up's, not the drain's)
        "series": {"t_s": [-0.4, 0.5, window_s, window_s + 0.3],
                   "kv_offload_used_tokens": [100.0, 3000.0, 5000.0, 9000.0],
                   "kv_offload_capacity_tokens": [65536.0] * 4},
        "window": {"kv_cache_usage": {"mean": 0.3, "max": 0.5}, "prefix_cache_queries": 9000.0,
                   "prefix_cache_hits": 3000.0, "kv_offload_store_tokens": 4096.0, "kv_offload_load_tokens": 1024.0,
                   "kv_offload_used_tokens": 8900.0, "kv_offload_capacity_tokens": 0.0, "prompt_tokens": 9000.0,
                   "generation_tokens": 200.0, "prefix_cache_hit_rate": 0.333333},
        "raw_first": {pool % 0: 367360.0, pool % 1: 367360.0},
        "raw_last": {pool % 0: 367360.0, pool % 1: 367360.0, "sglang:is_cuda_graph{}": 1.0},
    }
    rows = _rows(capsys, tmp_path, write_results(tmp_path / "windows.json", doc), "agentx")
    _check_rows(rows, "agentx")
    assert rows[0]["server_metrics"] == _with(
        _absent(vllm["counts"]), present=True, adapter="vllm", metric_count=42,
        cache={"gpu_cache_hit_rate": 0.75, "cpu_cache_hit_rate": 0.25, "external_cache_hit_rate": 0.25,
               "overall_cache_hit_rate": 0.75, "prefix_cache_hits": 6000, "prefix_cache_queries": 8000,
               "external_prefix_cache_hits": 500, "external_prefix_cache_queries": 2000},
        kv_cache={"gpu_usage_pct": 0.625, "cpu_usage_pct": 0.25},
        kv_offload={"bytes_gpu_to_cpu": 4_000_000_000, "bytes_cpu_to_gpu": 1_000_000_000, "time_gpu_to_cpu": 2,
                    "time_cpu_to_gpu": 0.5, "bandwidth_gpu_to_cpu_bytes_per_second": 2_000_000_000,
                    "bandwidth_cpu_to_gpu_bytes_per_second": 2_000_000_000},
        tokens={"prompt_total": 8000, "generation_total": 190})
    assert rows[0]["kv_cache_pool_tokens"] is None
    assert rows[1]["server_metrics"] == _with(
        _absent(sglang["counts"]), present=True, adapter="sglang", metric_count=60,
        cache={"gpu_cache_hit_rate": 0.33333, "overall_cache_hit_rate": 0.33333, "prefix_cache_hits": 3000,
               "prefix_cache_queries": 9000},
        kv_cache={"gpu_usage_pct": 0.5, "gpu_total_tokens": 734720, "cpu_usage_pct": round(5000 / 65536, 5),
                  "cpu_used_tokens": 5000, "cpu_total_tokens": 65536},
        tokens={"prompt_total": 9000, "generation_total": 200})
    assert rows[1]["kv_cache_pool_tokens"] == 734720  # InferenceX copies the pool to the top level


def test_agentx_without_server_metrics_exports_the_absent_form(result, capsys, tmp_path):
    """The sweep's server has no /metrics (every scrape failed); an older results file has no block."""
    doc = json.loads(result.read_text())
    assert doc["levels"][1]["server_metrics"]["scrapes"] == 0
    del doc["levels"][0]["server_metrics"]
    rows = _rows(capsys, tmp_path, write_results(tmp_path / "absent.json", doc), "agentx")
    _check_rows(rows, "agentx")
    for row, level in zip(rows, doc["levels"]):
        assert row["server_metrics"] == _absent(level["counts"]) and row["kv_cache_pool_tokens"] is None
        assert row["agentload"]["usage_cache_hit_rate"] == level["cache"]["measured_hit_rate"]
