"""Server-wide counters read from a server's /metrics (Prometheus text) when a window opens and after
its drain: the speculative-decoding counters (vLLM's names; the AL fallback, loadgen/run/spec_decode.py) and our
server's count of Triton kernels compiled while serving, whose difference says that the window's
latencies include compile stalls (server/engine/warmup.py). Read with loadgen/telemetry/prometheus.py."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from loadgen.telemetry.prometheus import ParseError, totals

METRIC_DRAFTS = "vllm:spec_decode_num_drafts_total"
METRIC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
METRIC_KERNEL_COMPILES = "agentload:kernel_compiles_total"


@dataclass(frozen=True, slots=True)
class SpecCounters:
    """Cumulative counts: per request from usage, or server-wide from /metrics."""

    num_drafts: int
    num_accepted_tokens: int


@dataclass(frozen=True, slots=True)
class ServerCounters:
    """One scrape; a counter the server does not report is None."""

    spec: SpecCounters | None
    kernel_compiles: int | None


def metric_totals(text: str, names: Collection[str]) -> dict[str, float] | None:
    """The named metrics out of Prometheus text, each summed over its label sets (absent ones left
    out); None when a line of a named metric does not parse (other lines are not read)."""
    try:
        return totals(text, names)
    except ParseError:
        return None


def spec_counters_of(totals: dict[str, float]) -> SpecCounters | None:
    """Both speculative counters, or None if either is absent."""
    if METRIC_DRAFTS not in totals or METRIC_ACCEPTED not in totals:
        return None
    return SpecCounters(int(totals[METRIC_DRAFTS]), int(totals[METRIC_ACCEPTED]))


def parse_server_counters(text: str) -> ServerCounters | None:
    """Every counter loadgen reads, from one scrape; None when one of them does not parse."""
    totals = metric_totals(text, (METRIC_DRAFTS, METRIC_ACCEPTED, METRIC_KERNEL_COMPILES))
    if totals is None:
        return None
    compiles = totals.get(METRIC_KERNEL_COMPILES)
    return ServerCounters(spec_counters_of(totals), None if compiles is None else int(compiles))
