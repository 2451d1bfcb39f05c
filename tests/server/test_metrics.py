"""Prometheus exposition: histogram buckets and a render that parses, with vLLM's names; the GPUs' readings
when NVML is there (a fake module), none without it."""

from __future__ import annotations

import sys

from server.engine.messages import EngineStats
from server.gpu_metrics import GpuGauges
from server.metrics import Histogram, ServerMetrics
from tests.fake_gpu import FakeGpu, FakePynvml


def test_histogram_buckets_are_cumulative_with_inf(parse_prometheus):
    hist = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        hist.observe(value)
    samples = parse_prometheus("\n".join(["# TYPE x histogram", *hist.lines("x", 'm="a"')]) + "\n")
    assert samples[("x_bucket", (("le", "0.1"), ("m", "a")))] == 2  # le is inclusive
    assert samples[("x_bucket", (("le", "1.0"), ("m", "a")))] == 3
    assert samples[("x_bucket", (("le", "+Inf"), ("m", "a")))] == 4
    assert samples[("x_count", (("m", "a"),))] == 4
    assert abs(samples[("x_sum", (("m", "a"),))] - 3.65) < 1e-9


def test_render_exports_engine_stats_and_request_latencies(parse_prometheus):
    metrics = ServerMetrics('my "model"')
    metrics.ttft.observe(0.2)
    metrics.itl.observe(0.01)
    metrics.e2e.observe(1.0)
    metrics.observe_finished("length")
    metrics.observe_finished("length")
    metrics.observe_rejected("overloaded")
    stats = EngineStats(num_running=3, num_waiting=2, kv_cache_usage=0.5, prefix_cache_queries=100,
                        prefix_cache_hits=64, num_preemptions=1, prompt_tokens=120,
                        generation_tokens=40, spec_accepted_per_position=(5, 3))
    text = metrics.render(stats, api_requests_in_flight=4).decode()
    samples = parse_prometheus(text)
    label = (("model_name", 'my \\"model\\"'),)
    assert samples[("vllm:num_requests_running", label)] == 3
    assert samples[("vllm:num_requests_waiting", label)] == 2
    assert samples[("vllm:kv_cache_usage_perc", label)] == 0.5
    assert samples[("vllm:prefix_cache_queries_total", label)] == 100
    assert samples[("vllm:prefix_cache_hits_total", label)] == 64
    assert samples[("vllm:prompt_tokens_total", label)] == 120
    assert samples[("vllm:generation_tokens_total", label)] == 40
    assert samples[("vllm:num_preemptions_total", label)] == 1
    assert samples[("vllm:time_to_first_token_seconds_count", label)] == 1
    assert samples[("vllm:inter_token_latency_seconds_count", label)] == 1
    assert samples[("vllm:e2e_request_latency_seconds_count", label)] == 1
    assert samples[("vllm:request_success_total", (("finished_reason", "length"), *label))] == 2
    assert samples[("agentload:requests_rejected_total", (("code", "overloaded"), *label))] == 1
    assert samples[("vllm:spec_decode_num_accepted_tokens_per_pos_total", (*label, ("position", "1")))] == 3
    assert samples[("agentload:api_requests_in_flight", label)] == 4
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text
    assert "# TYPE vllm:prompt_tokens_total counter" in text


def _fake_nvml(count: int) -> FakePynvml:
    return FakePynvml([FakeGpu("NVIDIA H100 80GB HBM3", power_w=650.5, energy_j=None if i == 1 else 2000.5,
                               sm_clock_mhz=1980, memory_used_bytes=(60 + i) * 2**30, utilization_pct=90 + i,
                               uuid=f"GPU-{i}") for i in range(count)])


def test_render_exports_the_gpus_nvml_reads(parse_prometheus, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(2))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    text = ServerMetrics("m").render(EngineStats(), 0, GpuGauges(2).read()).decode()
    samples = parse_prometheus(text)
    gpu = [(("gpu", str(i)), ("name", "NVIDIA H100 80GB HBM3")) for i in range(2)]
    assert samples[("agentload:gpu_power_watts", gpu[0])] == 650.5
    assert samples[("agentload:gpu_energy_joules_total", gpu[0])] == 2000.5
    assert ("agentload:gpu_energy_joules_total", gpu[1]) not in samples  # GPU 1 has no energy counter
    assert samples[("agentload:gpu_sm_clock_mhz", gpu[1])] == 1980
    assert samples[("agentload:gpu_memory_used_bytes", gpu[1])] == 61 * 2**30
    assert samples[("agentload:gpu_utilization_ratio", gpu[1])] == 0.91
    assert "# TYPE agentload:gpu_energy_joules_total counter" in text
    assert "# TYPE agentload:gpu_power_watts gauge" in text


def test_render_exports_only_the_engines_gpus(parse_prometheus, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(4))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-3")
    samples = parse_prometheus(ServerMetrics("m").render(EngineStats(), 0, GpuGauges(1).read()).decode())
    assert [labels for name, labels in samples if name == "agentload:gpu_power_watts"] == [
        (("gpu", "2"), ("name", "NVIDIA H100 80GB HBM3"))]


def test_render_lacks_gpu_metrics_without_nvml_or_on_cpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    without_module = GpuGauges(1)
    assert without_module.read() == {} and not without_module.enabled
    fake = _fake_nvml(1)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    fake.driver = False
    assert GpuGauges(1).read() == {}
    fake.driver = True
    on_cpu = GpuGauges(0)  # the engine runs on no GPU
    assert on_cpu.read() == {} and fake.initialised == 0
    for gpus in (None, {}):
        assert b"agentload:gpu_" not in ServerMetrics("m").render(EngineStats(), 0, gpus)
