"""The AgentX row's `server_metrics` block, filled from a level's /metrics series (the results
file's `levels[i].server_metrics`, docs/results_schema.md) the way InferenceX's agentic
aggregation fills it from AIPerf's server-metrics export: InferenceX's
utils/agentic/aggregation/backends/base.py names the keys and writes the absent form,
backends/vllm.py and backends/sglang.py the values, server_metrics.py the fallbacks.

Statistics and units are upstream's, whose export summarises the profiling phase as ours
summarises the window:
- counters are their growth over the window (to the last scrape, after the drain): prefix-cache
  hits and queries and the token totals in tokens, KV-offload transfers in bytes and seconds;
- gauges are their maximum over the window's scrapes; `kv_cache.gpu_usage_pct` and
  `cpu_usage_pct` are fractions (0..1) despite their names;
- hit rates are hits / queries (null without queries), bandwidths bytes / seconds;
  `overall_cache_hit_rate` is the GPU rate, as upstream's vLLM adapter sets it when the server
  has no prompt-tokens-by-source counter. SGLang's hits are all its cached tokens: with HiCache
  they include the host's, which upstream's GPU rate leaves out (our adapter keeps no split).

A level without the block (older results, `--server-metrics-interval 0`) or whose scrapes all
failed gets upstream's absent form: `present` false, adapter "none", every value null, the token
totals from the measured requests (as upstream falls back to its records).

Left null or empty, as upstream leaves what its export cannot give it: the prompt tokens by
source and `cached_tokens_by_source` (our adapters keep no per-source split), `sources` (nor
per-engine series), the Dynamo frontend and router keys, and `kv_cache.gpu_total_tokens` except
from SGLang's `max_total_num_tokens` gauge: upstream reads vLLM's pool from the server log, which
we do not have (vLLM's metrics give blocks, whose tokens differ on hybrid models), and our server
exposes no pool size.
"""

from __future__ import annotations

from typing import Any

# Our adapters' names as upstream's; ours reads vLLM's metric names (loadgen/telemetry/engines.py).
ADAPTERS = {"vllm": "vllm", "sglang": "sglang", "ours": "vllm"}
SGLANG_POOL = "sglang:max_total_num_tokens"


def server_metrics_block(level: dict[str, Any]) -> dict[str, Any]:
    """One level's block, every key upstream writes."""
    counts = level["counts"]
    server = level.get("server_metrics") or {}  # with no scrape, every lookup below finds nothing
    window = server.get("window") or {}
    hits, queries = _growth(window, "prefix_cache_hits"), _growth(window, "prefix_cache_queries")
    external_hits, external_queries = _growth(window, "kv_offload_hits"), _growth(window, "kv_offload_queries")
    gpu_rate, external_rate = _rate(hits, queries), _rate(external_hits, external_queries)
    # SGLang's HiCache host pool: gauges that the window summary takes as counters, so read from the series.
    host_used = _series_max(server, "kv_offload_used_tokens", level["window_s"])
    host_total = _series_max(server, "kv_offload_capacity_tokens", level["window_s"])
    cpu_usage = _peak(window, "kv_offload_usage")
    stored, loaded = _growth(window, "kv_offload_store_bytes"), _growth(window, "kv_offload_load_bytes")
    store_s, load_s = _growth(window, "kv_offload_store_seconds"), _growth(window, "kv_offload_load_seconds")
    prompt, generation = _growth(window, "prompt_tokens"), _growth(window, "generation_tokens")
    return {
        "present": bool(server.get("scrapes")),
        "adapter": ADAPTERS.get(server.get("adapter") or "", "none"),
        "metric_count": server.get("metric_count") or 0,
        "cache": {
            "gpu_cache_hit_rate": gpu_rate, "cpu_cache_hit_rate": external_rate,
            "external_cache_hit_rate": external_rate, "overall_cache_hit_rate": gpu_rate,
            "prefix_cache_hits": hits, "prefix_cache_queries": queries,
            "external_prefix_cache_hits": external_hits, "external_prefix_cache_queries": external_queries,
            "cached_tokens_by_source": {}, "frontend_cache_hit_rate": None, "router_kv_hit_rate": None,
            "router_shared_cache_hit_rate": None, "frontend_cached_tokens": None, "frontend_input_tokens": None,
        },
        "kv_cache": {
            "gpu_usage_pct": _peak(window, "kv_cache_usage"),
            "gpu_total_tokens": _sglang_pool(server),
            "cpu_usage_pct": cpu_usage if cpu_usage is not None else _rate(host_used, host_total),
            "cpu_used_tokens": host_used, "cpu_total_tokens": host_total,
        },
        "kv_offload": {
            "bytes_gpu_to_cpu": stored, "bytes_cpu_to_gpu": loaded,
            "time_gpu_to_cpu": store_s, "time_cpu_to_gpu": load_s,
            "bandwidth_gpu_to_cpu_bytes_per_second": _rate(stored, store_s),
            "bandwidth_cpu_to_gpu_bytes_per_second": _rate(loaded, load_s),
        },
        "tokens": {
            "prompt_total": round(prompt) if prompt is not None else counts["input_tokens"],
            "generation_total": round(generation) if generation is not None else counts["output_tokens"],
            "requests_completed": counts["requests_ok"],
            "prompt_by_source": {"gpu_cache_hit": None, "cpu_or_external_cache_hit": None, "computed": None,
                                 "raw": {}},
        },
        "sources": [],
    }


def _growth(window: dict[str, Any], name: str) -> float | None:
    """A counter's growth over the window; null where a scrape lacked it."""
    value = window.get(name)
    return value if isinstance(value, int | float) else None


def _peak(window: dict[str, Any], name: str) -> float | None:
    """A gauge's maximum over the window's scrapes."""
    value = window.get(name)
    return value["max"] if isinstance(value, dict) else None


def _series_max(server: dict[str, Any], name: str, window_s: float) -> float | None:
    series = server.get("series", {})
    seen = [value for t, value in zip(series.get("t_s", []), series.get(name, []))
            if value is not None and 0 <= t <= window_s]
    return max(seen) if seen else None


def _sglang_pool(server: dict[str, Any]) -> int | None:
    """SGLang's KV pool in tokens, summed over its ranks (upstream: sglang:max_total_num_tokens); no
    adapter takes that gauge, so it is among the raw samples, kept from the first and the last scrape."""
    raw = server.get("raw_last") or server.get("raw_first") or {}
    sizes = [value for series, value in raw.items() if series.split("{", 1)[0] == SGLANG_POOL]
    return round(sum(sizes)) if sizes else None


def _rate(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator
