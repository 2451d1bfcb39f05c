"""`loadgen report --format infx|agentx` on results of the real replay pipeline: rows valid against
the JSON Schemas written from InferenceX's ingest, shaped like the checked-in example rows, with
InferenceX's statistics recomputed here from the request columns; identity flags and errors."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from loadgen.cli import main
from loadgen.export.infx_identity import ExportError, IdentityFlags, resolve_identity
from loadgen.results import write_results

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "loadgen" / "schemas"
EXAMPLES = Path(__file__).with_name("data")
IDENTITY = ("--hw", "h200", "--framework", "vllm", "--precision", "fp8", "--model-prefix", "dsv4")
_RUN: dict[str, Path] = {}


def _validator(shape: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / f"{shape}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _example(shape: str) -> dict:
    return json.loads((EXAMPLES / f"{shape}_example_row.json").read_text())


@pytest.fixture
def result(start_server, sessions, replay, tmp_path_factory) -> Path:
    """A 2-level sweep (conc 1, 3) whose sessions grow their input (so ISL varies) and ask 6 tokens."""
    if not _RUN:
        folder = sessions(*({"n_requests": 3, "think": 0.0, "n_out": 6} for _ in range(6)))
        server = start_server(first_ms=15, itl_ms=4.0)
        code, doc, _ = replay(server.url, "--traces", str(folder), "--conc", "1,3", "--duration", "1.2",
                              "--gpus", "8")
        assert code == 0
        _RUN["path"] = write_results(tmp_path_factory.mktemp("infx") / "result.json", doc)
    return _RUN["path"]


def _report(capsys, *args) -> tuple[int, str, str]:
    code = main(["report", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def _rows(capsys, tmp_path, result, shape, *flags) -> list[dict]:
    code, out, err = _report(capsys, result, "--format", shape, "--out", tmp_path, *IDENTITY, *flags)
    assert code == 0, err
    assert f"wrote {tmp_path / f'{shape}.json'}" in out
    return json.loads((tmp_path / f"{shape}.json").read_text())


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
    itl = level["metrics"]["itl"]["stats"]  # per chunk, from the HDR histogram
    assert row["p99_itl"] == pytest.approx(itl["p99"] / 1e6) and row["median_itl"] == pytest.approx(itl["p50"] / 1e6)
    gpus = 4 * 2  # tp x pp x pcp_size
    tokens = counts["input_tokens"] + counts["output_tokens"]
    assert row["tput_per_gpu"] == pytest.approx(tokens / level["window_s"] / gpus)
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
    assert latency["intvty"]["p90"] == pytest.approx(1 / latency["itl"]["p90"], rel=1e-3)  # slow tail
    assert latency["intvty"]["std"] == pytest.approx((1 / itl).std(), abs=1e-4)
    per_token = np.asarray(columns["e2el_us"]) / 1e6 / np.asarray(columns["osl"])
    assert latency["e2e_norm_intvty"]["p50"] == pytest.approx(1 / np.percentile(per_token, 50), rel=1e-3)
    counts = level["counts"]
    accounting = row["request_accounting"]
    assert accounting["records_profiled"] == row["num_requests_successful"] == counts["requests_ok"]
    assert accounting["records_total"] == counts["requests_ok"] + counts["errors_total"] + counts["warmup_requests_ok"]
    assert row["num_requests_total"] == accounting["records_total"]
    per_gpu = row["request_metrics"]["throughput"]["per_gpu"]
    assert per_gpu["output_tput_tps"] == pytest.approx(counts["output_tokens"] / level["window_s"] / 8, abs=1e-4)


def test_failed_levels_are_left_out(result, capsys, tmp_path):
    doc = json.loads(result.read_text())
    doc["levels"][0].update(failed=True, fail_reasons=["error rate 50.0% > --max-error-rate 10.0%"])
    failed = write_results(tmp_path / "failed.json", doc)
    rows = _rows(capsys, tmp_path, failed, "agentx")
    assert [row["conc"] for row in rows] == [3]


@pytest.mark.parametrize(("flags", "message"), [
    (("--format", "agentx"), "--hw, --framework, --precision, --model-prefix required"),
    (("--format", "infx", *IDENTITY), "--isl: the fixed-sequence shape needs one nominal ISL"),
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


def _our_config(num_gpus: int, speculative: dict | None = None) -> dict:
    return {"model": "v32", "gpus": max(1, num_gpus),
            "server": {"ours": True, "num_gpus": num_gpus, "models_entry": {"speculative": speculative}}}


def test_our_server_fills_the_identity():
    identity = resolve_identity(IdentityFlags(), _our_config(2, {"method": "dspark"}), "r")
    assert (identity.hw, identity.framework, identity.precision, identity.infmax_model_prefix) == \
        ("h200", "agentload", "bf16", "v32")
    assert (identity.tp, identity.gpus, identity.spec_decoding) == (2, 2, "mtp")
    assert resolve_identity(IdentityFlags(hw="b200"), _our_config(1), "r").keys()["spec_decoding"] == "none"
    with pytest.raises(ExportError, match="--tp x --pp x --pcp-size = 4 GPUs, but our server ran on 2"):
        resolve_identity(IdentityFlags(tp=4), _our_config(2), "r")
    with pytest.raises(ExportError, match="--hw required .*served from CPU"):
        resolve_identity(IdentityFlags(), _our_config(0), "r")


def test_a_run_that_expected_a_golden_al_is_filed_as_speculating():
    config = {"model": "m", "gpus": 1, "server": {"ours": False}, "spec_decode": {"k": 3, "golden_al": "dsv4_mtp"}}
    flags = IdentityFlags(hw="h200", framework="vllm", precision="fp8", model_prefix="dsv4")
    assert resolve_identity(flags, config, "r").spec_decoding == "mtp"
    assert resolve_identity(flags, {**config, "spec_decode": None}, "r").spec_decoding == "none"


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
        resolve_identity(flags, {"model": "m", "gpus": 1, "server": {"ours": False}}, "r")
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
