"""Adapters from an engine's /metrics exposition to normalised quantities, so that a level's
series read the same whichever server ran it: vLLM's names, SGLang's, and ours (vLLM's names
where they exist, plus `agentload:*`).

A quantity is read from the first of its sources that the scrape has (newer names before
deprecated ones) and summed over that source's label sets (model, engine, data-parallel rank);
ratios (cache usage, acceptance rate) are averaged over them instead. A NaN sample is no reading.
Samples that no quantity takes are kept raw, keyed by their series as the server wrote it, so an
engine we have no adapter for still leaves its numbers in the results; `_created` samples (the
start times of counters) are left out.

Counts are in the engine's units: tokens for prefix-cache queries and hits, bytes and seconds or
tokens for KV offloading. SGLang counts prompt, generated and cached tokens when a request
finishes; its `realtime_tokens_total` (prefix-cache queries and hits, when present) as it goes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from loadgen.telemetry.prometheus import Row, family_of, scan


@dataclass(frozen=True, slots=True)
class Source:
    """A sample name; with `label`, only its series whose label is one of `values` (a series
    without the label has the empty value)."""

    name: str
    label: str | None = None
    values: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Quantity:
    """A normalised quantity: the first of `sources` the scrape has, summed over its label sets
    or, for a ratio, averaged (`mean`)."""

    name: str
    sources: tuple[Source, ...]
    mean: bool = False


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """One scrape, normalised. metric_count: the metric families it exposed (a counter or a
    histogram with its `_created` series counts once)."""

    adapter: str | None
    values: dict[str, float]
    raw: dict[str, float]
    metric_count: int


def _q(name: str, *sources: str | Source, mean: bool = False) -> Quantity:
    return Quantity(name, tuple(s if isinstance(s, Source) else Source(s) for s in sources), mean)


def _transfer(name: str, direction: str) -> Source:
    return Source(name, "transfer_type", frozenset({direction}))


VLLM = (
    _q("running", "vllm:num_requests_running"),
    _q("waiting", "vllm:num_requests_waiting"),
    _q("kv_cache_usage", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", mean=True),
    _q("prefix_cache_queries", "vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    _q("prefix_cache_hits", "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    _q("preemptions", "vllm:num_preemptions_total"),
    _q("prompt_tokens", "vllm:prompt_tokens_total"),
    _q("generation_tokens", "vllm:generation_tokens_total"),
    _q("spec_drafts", "vllm:spec_decode_num_drafts_total"),
    _q("spec_draft_tokens", "vllm:spec_decode_num_draft_tokens_total"),
    _q("spec_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_total"),
    # Tokens a KV connector supplied: with an offloading connector, the offload tier's hits.
    _q("kv_offload_queries", "vllm:external_prefix_cache_queries_total"),
    _q("kv_offload_hits", "vllm:external_prefix_cache_hits_total"),
    _q("kv_offload_usage", "vllm:kv_offload_cpu_cache_usage_perc", mean=True),
    # The flat names, then the deprecated ones with a transfer_type label.
    _q("kv_offload_load_bytes", "vllm:kv_offload_load_bytes_total",
       _transfer("vllm:kv_offload_total_bytes_total", "CPU_to_GPU")),
    _q("kv_offload_store_bytes", "vllm:kv_offload_store_bytes_total",
       _transfer("vllm:kv_offload_total_bytes_total", "GPU_to_CPU")),
    _q("kv_offload_load_seconds", "vllm:kv_offload_load_time_total",
       _transfer("vllm:kv_offload_total_time_total", "CPU_to_GPU")),
    _q("kv_offload_store_seconds", "vllm:kv_offload_store_time_total",
       _transfer("vllm:kv_offload_total_time_total", "GPU_to_CPU")),
)

# With priority scheduling SGLang adds per-priority series to a total whose priority is empty.
_ALL_PRIORITIES = frozenset({""})
_REALTIME = "sglang:realtime_tokens_total"

SGLANG = (
    _q("running", Source("sglang:num_running_reqs", "priority", _ALL_PRIORITIES)),
    _q("waiting", Source("sglang:num_queue_reqs", "priority", _ALL_PRIORITIES)),
    _q("kv_cache_usage", "sglang:token_usage", mean=True),
    _q("prefix_cache_queries", Source(_REALTIME, "mode", frozenset({"prefill_compute", "prefill_cache"})),
       "sglang:prompt_tokens_total"),
    _q("prefix_cache_hits", Source(_REALTIME, "mode", frozenset({"prefill_cache"})), "sglang:cached_tokens_total"),
    _q("preemptions", "sglang:num_retracted_requests_total"),
    _q("prompt_tokens", "sglang:prompt_tokens_total"),
    _q("generation_tokens", "sglang:generation_tokens_total"),
    # One verify step of one request: what vLLM counts as a draft.
    _q("spec_drafts", "sglang:spec_verify_calls_total"),
    _q("spec_accept_length", "sglang:spec_accept_length", mean=True),
    _q("spec_accept_rate", "sglang:spec_accept_rate", mean=True),
    # HiCache: tokens written to and read back from host memory, and the host pool.
    _q("kv_offload_store_tokens", "sglang:evicted_tokens_total"),
    _q("kv_offload_load_tokens", "sglang:load_back_tokens_total"),
    _q("kv_offload_used_tokens", "sglang:hicache_host_used_tokens"),
    _q("kv_offload_capacity_tokens", "sglang:hicache_host_total_tokens"),
)

OURS = (
    *VLLM,
    _q("kernel_compiles", "agentload:kernel_compiles_total"),
    _q("requests_rejected", "agentload:requests_rejected_total"),
    _q("api_requests_in_flight", "agentload:api_requests_in_flight"),
    _q("gpu_power_watts", "agentload:gpu_power_watts"),
    _q("gpu_energy_joules", "agentload:gpu_energy_joules_total"),
    _q("gpu_sm_clock_mhz", "agentload:gpu_sm_clock_mhz", mean=True),
    _q("gpu_memory_used_bytes", "agentload:gpu_memory_used_bytes"),
    _q("gpu_utilization", "agentload:gpu_utilization_ratio", mean=True),
)

ADAPTERS: dict[str, tuple[Quantity, ...]] = {"vllm": VLLM, "sglang": SGLANG, "ours": OURS}

# (source index, label, values) for each sample name an adapter reads.
_Index = dict[str, tuple[tuple[int, str | None, frozenset[str]], ...]]


def _index(quantities: tuple[Quantity, ...]) -> tuple[list[Source], _Index]:
    sources = [source for quantity in quantities for source in quantity.sources]
    index: dict[str, list[tuple[int, str | None, frozenset[str]]]] = {}
    for slot, source in enumerate(sources):
        index.setdefault(source.name, []).append((slot, source.label, source.values))
    return sources, {name: tuple(entries) for name, entries in index.items()}


_INDEXES = {name: _index(quantities) for name, quantities in ADAPTERS.items()}


def detect(names: Iterable[str]) -> str | None:
    """The adapter for a server exposing these metric names: ours if any is `agentload:*`, else
    whichever of vLLM's and SGLang's prefixes more names carry; None for neither."""
    vllm = sglang = 0
    for name in names:
        if name.startswith("agentload:"):
            return "ours"
        vllm += name.startswith("vllm:")
        sglang += name.startswith("sglang:")
    if not vllm and not sglang:
        return None
    return "vllm" if vllm >= sglang else "sglang"


def normalise(text: str, adapter: str | None = None) -> EngineMetrics:
    """One exposition through `adapter` (detected from its names when None). Raises
    prometheus.ParseError for a malformed line, ValueError for an unknown adapter."""
    if adapter is not None and adapter not in ADAPTERS:
        raise ValueError(f"unknown adapter {adapter!r}: expected one of {', '.join(ADAPTERS)}")
    families: dict[str, str] = {}
    rows = list(scan(text, families))
    names = {row[1] for row in rows}
    chosen = adapter if adapter is not None else detect(families.keys() | names)
    counted = {family_of(name, families) for name in names if not name.endswith("_created")}
    if chosen is None:
        return EngineMetrics(None, {}, _fold(rows, {}, [], []), len(counted))
    sources, index = _INDEXES[chosen]
    sums = [0.0] * len(sources)
    counts = [0] * len(sources)
    raw = _fold(rows, index, sums, counts)
    return EngineMetrics(chosen, _values(ADAPTERS[chosen], sums, counts), raw, len(counted))


def _fold(rows: list[Row], index: _Index, sums: list[float], counts: list[int]) -> dict[str, float]:
    """Adds each row to the sources that take it; returns the rows none takes (the raw ones)."""
    raw: dict[str, float] = {}
    for series, name, labels, value, _, _ in rows:
        taken = False
        for slot, label, wanted in index.get(name, ()):
            if label is None or dict(labels).get(label, "") in wanted:
                taken = True
                if value == value:  # NaN is no reading
                    sums[slot] += value
                    counts[slot] += 1
        if not taken and not name.endswith("_created"):
            raw[series] = value
    return raw


def _values(quantities: tuple[Quantity, ...], sums: list[float], counts: list[int]) -> dict[str, float]:
    values: dict[str, float] = {}
    slot = 0
    for quantity in quantities:
        for i in range(slot, slot + len(quantity.sources)):
            if counts[i]:
                values[quantity.name] = sums[i] / counts[i] if quantity.mean else sums[i]
                break
        slot += len(quantity.sources)
    return values
