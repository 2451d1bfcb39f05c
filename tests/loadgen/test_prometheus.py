"""loadgen/telemetry: the Prometheus/OpenMetrics text reader and the engine adapters, on recorded-style
expositions of vLLM (tests/loadgen/data/vllm_metrics.prom, text 0.0.4 with a label holding every escape)
and SGLang (sglang_metrics.prom, OpenMetrics with an exemplar, NaN and two data-parallel ranks), and on
our server's own exposition rendered by server/metrics.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from loadgen.telemetry.engines import ADAPTERS, detect, normalise
from loadgen.telemetry.prometheus import ParseError, parse, totals
from server.engine.messages import EngineStats
from server.metrics import ServerMetrics

DATA = Path(__file__).with_name("data")
VLLM = (DATA / "vllm_metrics.prom").read_text()
SGLANG = (DATA / "sglang_metrics.prom").read_text()

# What every adapter reads from a server that serves these quantities (speculative decoding on).
COMMON = {"running", "waiting", "kv_cache_usage", "prefix_cache_queries", "prefix_cache_hits", "preemptions",
          "prompt_tokens", "generation_tokens", "spec_drafts"}


def ours(stats: EngineStats, model: str = "tiny", extra: str = "") -> str:
    metrics = ServerMetrics(model)
    metrics.ttft.observe(0.2)
    metrics.observe_finished("stop")
    return metrics.render(stats, 5).decode() + extra


def test_vllm_and_sglang_normalise_to_the_same_names():
    vllm, sglang = normalise(VLLM), normalise(SGLANG)
    assert (vllm.adapter, sglang.adapter) == ("vllm", "sglang")
    assert COMMON <= vllm.values.keys() and COMMON <= sglang.values.keys()
    assert set(vllm.values) | set(sglang.values) <= {q.name for adapter in ADAPTERS.values() for q in adapter}
    assert {k: vllm.values[k] for k in ("running", "waiting", "preemptions", "spec_drafts")} == {
        "running": 23, "waiting": 6, "preemptions": 17, "spec_drafts": 402_113}
    assert vllm.values["kv_cache_usage"] == 0.8734
    assert (vllm.values["spec_draft_tokens"], vllm.values["spec_accepted_tokens"]) == (1_206_339, 797_405)


def test_sglang_sums_ranks_and_averages_ratios():
    """Two data-parallel ranks: counts add up, usage and acceptance are averaged; the prefix cache
    comes from the running token counter (modes prefill_cache and prefill_compute), not from the
    per-request counters that move only when requests finish."""
    values = normalise(SGLANG).values
    assert (values["running"], values["waiting"], values["preemptions"]) == (31 + 29, 4 + 3, 9 + 12)
    assert values["kv_cache_usage"] == pytest.approx((0.82 + 0.78) / 2)
    assert values["spec_accept_length"] == pytest.approx((2.91 + 2.83) / 2)
    assert values["prefix_cache_hits"] == 20_411_904 + 19_988_224  # sglang:cached_tokens_total is 40,102,400
    assert values["prefix_cache_queries"] == 20_411_904 + 19_988_224 + 1_902_113 + 1_877_540
    assert (values["kv_offload_store_tokens"], values["kv_offload_load_tokens"]) == (16_400_500, 4_050_000)


def test_sglang_without_running_token_counter_and_with_priorities():
    text = ('sglang:num_running_reqs{priority=""} 5\nsglang:num_running_reqs{priority="1"} 2\n'
            'sglang:num_running_reqs{priority="3"} 3\nsglang:prompt_tokens_total 100\n'
            'sglang:cached_tokens_total{model_name="m"} 60\n')
    values = normalise(text).values
    assert values == {"running": 5, "prefix_cache_queries": 100, "prefix_cache_hits": 60, "prompt_tokens": 100}


def test_vllm_offload_flat_names_then_deprecated_and_older_cache_names():
    assert {k: v for k, v in normalise(VLLM).values.items() if k.startswith("kv_offload_")} == {
        "kv_offload_queries": 5_223_232, "kv_offload_hits": 1_048_576, "kv_offload_usage": 0.3125,
        "kv_offload_load_bytes": 73_400_320_000, "kv_offload_store_bytes": 295_279_001_600,
        "kv_offload_load_seconds": 3.8125, "kv_offload_store_seconds": 14.25}
    older = ('vllm:gpu_cache_usage_perc{engine="0"} 0.5\nvllm:gpu_cache_usage_perc{engine="1"} 0.25\n'
             'vllm:gpu_prefix_cache_queries_total 10\nvllm:gpu_prefix_cache_hits_total 4\n'
             'vllm:kv_offload_total_bytes_total{transfer_type="CPU_to_GPU"} 7\n'
             'vllm:kv_offload_total_bytes_total{transfer_type="GPU_to_CPU"} 9\n')
    assert normalise(older).values == {"kv_cache_usage": 0.375, "prefix_cache_queries": 10, "prefix_cache_hits": 4,
                                       "kv_offload_load_bytes": 7, "kv_offload_store_bytes": 9}


def test_our_server_maps_through_ours():
    stats = EngineStats(num_running=7, num_waiting=2, kv_cache_usage=0.625, prefix_cache_queries=1000,
                        prefix_cache_hits=750, num_preemptions=3, prompt_tokens=1000, generation_tokens=400,
                        spec_num_drafts=90, spec_num_draft_tokens=270, spec_num_accepted_tokens=200,
                        spec_accepted_per_position=(80, 70, 50), kernel_compiles=1)
    gpus = ('agentload:gpu_power_watts{gpu="0"} 610.5\nagentload:gpu_power_watts{gpu="1"} 590.5\n'
            'agentload:gpu_utilization_ratio{gpu="0"} 1\nagentload:gpu_utilization_ratio{gpu="1"} 0.5\n'
            'agentload:gpu_energy_joules_total{gpu="0"} 1e6\nagentload:gpu_sm_clock_mhz{gpu="0"} 1980\n'
            'agentload:gpu_memory_used_bytes{gpu="0"} 7.5e10\n')
    reading = normalise(ours(stats, extra=gpus))
    assert reading.adapter == "ours"
    assert reading.values == {
        "running": 7, "waiting": 2, "kv_cache_usage": 0.625, "prefix_cache_queries": 1000, "prefix_cache_hits": 750,
        "preemptions": 3, "prompt_tokens": 1000, "generation_tokens": 400, "spec_drafts": 90,
        "spec_draft_tokens": 270, "spec_accepted_tokens": 200, "kernel_compiles": 1, "api_requests_in_flight": 5,
        "gpu_power_watts": 1201, "gpu_utilization": 0.75, "gpu_energy_joules": 1e6, "gpu_sm_clock_mhz": 1980,
        "gpu_memory_used_bytes": 7.5e10}
    assert reading.raw['vllm:request_success_total{model_name="tiny",finished_reason="stop"}'] == 1
    assert normalise(ours(stats), adapter="vllm").values.keys() <= {q.name for q in ADAPTERS["vllm"]}


def test_raw_keeps_unmapped_series_as_written_and_counts_families():
    families = parse(VLLM).families
    reading = normalise(VLLM)
    bucket = 'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-30B-A3B"}'
    assert reading.raw[bucket] == 1807
    assert reading.raw['http_requests_total{handler="/metrics",method="GET",status="2xx"}'] == 611
    assert not any("_created" in key for key in reading.raw)
    assert not any(key.startswith("vllm:num_requests_running") for key in reading.raw)
    # 0.0.4 from prometheus_client gives each counter's and histogram's `_created` a gauge family of its own
    assert reading.metric_count == len([name for name in families if not name.endswith("_created")])
    assert normalise(SGLANG).metric_count == len(parse(SGLANG).families)


def test_unknown_engine_is_kept_raw():
    text = "# TYPE trtllm_kv_cache_utilization gauge\ntrtllm_kv_cache_utilization 0.4\nfoo_created 1.7e9\n"
    reading = normalise(text)
    assert (reading.adapter, reading.values, reading.raw, reading.metric_count) == (
        None, {}, {"trtllm_kv_cache_utilization": 0.4}, 1)
    assert detect(["vllm:a", "sglang:b", "sglang:c"]) == "sglang"
    assert detect(["process_open_fds"]) is None
    with pytest.raises(ValueError, match="unknown adapter"):
        normalise(text, adapter="trtllm")


def test_families_and_suffixes():
    vllm, sglang = parse(VLLM), parse(SGLANG)
    assert vllm.families["vllm:prompt_tokens_total"] == "counter"  # 0.0.4 names the counter family with _total
    assert vllm.family_of("vllm:time_to_first_token_seconds_bucket") == "vllm:time_to_first_token_seconds"
    assert vllm.families["vllm:time_to_first_token_seconds"] == "histogram"
    assert vllm.families["http_request_size_bytes"] == "summary"
    assert sglang.families["sglang:prompt_tokens"] == "counter"  # OpenMetrics names it without
    assert sglang.family_of("sglang:prompt_tokens_total") == "sglang:prompt_tokens"
    assert sglang.family_of("sglang:prompt_tokens_created") == "sglang:prompt_tokens"
    assert sglang.family_of("not_typed_total") == "not_typed_total"


def test_escapes_round_trip():
    """Label values come back unescaped: from the fixtures, and from a name our server escapes."""
    lora = next(s for s in parse(VLLM).samples if s.name == "vllm:lora_requests_info")
    assert dict(lora.labels)["running_lora_adapters"] == 'sql-lora,C:\\adapters\\"v2"\nbeta'
    assert dict(lora.labels)["waiting_lora_adapters"] == ""
    reasons = {dict(s.labels)["output_reason"] for s in parse(SGLANG).samples
               if s.name == "sglang:prefill_delayer_outcomes_total"}
    assert reasons == {"no_wait", 'budget "soft" C:\\q\nretry'}
    model = 'org\\model "v2"\nq4'
    for sample in parse(ours(EngineStats(), model=model)).samples:
        assert dict(sample.labels)["model_name"] == model


def test_exemplars_timestamps_and_special_values():
    bucket = next(s for s in parse(SGLANG).samples if s.exemplar is not None)
    assert (bucket.name, bucket.labels, bucket.value) == (
        "sglang:time_to_first_token_seconds_bucket", (("le", "4.0"), ("model_name", "deepseek-ai/DeepSeek-V3.2")), 1782)
    exemplar = bucket.exemplar
    assert exemplar.labels == (("trace_id", "4bf92f3577b34da6a3ce929d0e0e4736"),)
    line = next(line for line in SGLANG.splitlines() if " # {" in line)
    assert line.endswith(f'# {{trace_id="{exemplar.labels[0][1]}"}} {exemplar.value!r} {exemplar.timestamp!r}')
    occupancy = [s.value for s in parse(SGLANG).samples if s.name == "sglang:fwd_occupancy"]
    assert len(occupancy) == 2 and all(math.isnan(v) for v in occupancy)
    samples = parse('a{x="1"} +Inf\nb -Inf 1700000000000\nc  NaN\t17\r\nd{} 1.5e-3 # {} 2\n').samples
    assert [(s.name, s.value, s.timestamp) for s in samples[:2]] == [("a", math.inf, None), ("b", -math.inf, 1.7e12)]
    assert math.isnan(samples[2].value) and samples[2].timestamp == 17
    assert (samples[3].labels, samples[3].value, samples[3].exemplar.labels, samples[3].exemplar.value) == (
        (), 0.0015, (), 2)


def test_a_known_series_with_a_new_shape_is_read_again():
    """A series read once is looked up by its text; a later line of it with a timestamp or a bad
    value still goes through the grammar."""
    assert parse('k{a="1"} 2\n').samples[0].value == 2
    again = parse('k{a="1"} 3 1000\n').samples[0]
    assert (again.value, again.timestamp) == (3, 1000)
    with pytest.raises(ParseError, match="line 1"):
        parse('k{a="1"} three\n')


@pytest.mark.parametrize("line", [
    'm{x=1} 2', 'm{x="1" 2', 'm{x="1"}', 'm 1 2 3', 'm{x="a\nb"} 1', '9m 1', 'm one',
    "# TYPE m", "# TYPE m countr", "# TYPE 9m gauge", "# HELP", "m 1 # 2",
])
def test_malformed_lines_name_their_line(line):
    text = f"# HELP ok fine\n# TYPE ok gauge\nok 1\n\n{line}\nok 2\n"
    number = 5
    with pytest.raises(ParseError) as caught:
        parse(text)
    assert caught.value.line_number == number and f"line {number}:" in str(caught.value)


def test_totals_reads_only_the_named_lines():
    text = ('# HELP a_total a_total in a comment\na_total{m="x"} 2\na_total{m="y"} 3 1700000000000\n'
            'a_total_created{m="x"} 1.7e9\nb_total 4\nbroken line\n')
    assert totals(text, ["a_total", "b_total", "c_total"]) == {"a_total": 5, "b_total": 4}
    assert totals(VLLM, ("vllm:spec_decode_num_drafts_total",)) == {"vllm:spec_decode_num_drafts_total": 402_113}
    with pytest.raises(ParseError, match="line 2"):
        totals("b_total 1\na_total x\n", ["a_total"])


def test_blank_and_crlf_lines():
    assert [(s.name, s.value) for s in parse("a 1\r\n  \r\n\nb 2\r\n# EOF\n").samples] == [("a", 1), ("b", 2)]
