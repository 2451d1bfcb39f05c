"""Prometheus exposition: histogram buckets and a render that parses, with vLLM's names."""

from __future__ import annotations

from server.engine.messages import EngineStats
from server.metrics import Histogram, ServerMetrics


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
