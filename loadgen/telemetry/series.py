"""A server's /metrics as a time series over one level: scraped every `interval_s` while the level
runs (`--server-metrics-interval`), normalised by the engine's adapter (loadgen/telemetry/engines.py),
and summarised over the level's window.

A scrape that fails (the server refused, timed out, answered non-200 or unreadable text) is
counted and its reason kept, never fatal. Every successful scrape keeps its normalised values; the
raw samples no adapter took are kept from the first and the last scrape only (a histogram-heavy
server exposes thousands of series a second).

Window summary: the gauges' mean and maximum over the scrapes inside the window (running and
waiting requests, KV-cache usage, ...), and the counters' growth from the last scrape at or before
the window opened (the first one after it when none came before) to the last scrape of the level,
after the drain, so that the window's requests are all in it: prefix-cache hits over queries (the
server's own hit rate), preemptions, prompt and generated tokens, speculative drafts and accepted
tokens, GPU energy where the server exports it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from loadgen.telemetry.engines import EngineMetrics, normalise

ERRORS_KEPT = 5  # failed scrapes whose reason is kept (all are counted)
GAUGES = ("running", "waiting", "kv_cache_usage", "kv_offload_usage", "kv_offload_used_tokens",
          "kv_offload_capacity_tokens", "api_requests_in_flight", "gpu_power_watts", "gpu_sm_clock_mhz",
          "gpu_memory_used_bytes", "gpu_utilization", "spec_accept_length", "spec_accept_rate")


class ServerSeries:
    def __init__(self, fetch: Callable[[], Awaitable[str]], interval_s: float) -> None:
        self._fetch = fetch
        self.interval_s = interval_s
        self.times_ns: list[int] = []
        self.values: list[dict[str, float]] = []
        self.first: EngineMetrics | None = None
        self.last: EngineMetrics | None = None
        self.failed = 0
        self.errors: list[str] = []

    async def run(self) -> None:
        """Scrape every interval until cancelled (the level's end); a scrape's own time is taken
        out of the wait, so the scrapes stay on their beat."""
        next_ns = time.perf_counter_ns()
        while True:
            await self.scrape()
            next_ns += int(self.interval_s * 1e9)
            await asyncio.sleep(max(0.0, (next_ns - time.perf_counter_ns()) / 1e9))

    async def scrape(self) -> None:
        at = time.perf_counter_ns()
        try:
            metrics = normalise(await self._fetch())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure to ask or to read is recorded, never fatal
            self.failed += 1
            if len(self.errors) < ERRORS_KEPT:
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
            return
        self.times_ns.append(at)
        self.values.append(metrics.values)
        self.first = self.first or metrics
        self.last = metrics

    def summary(self, window_start_ns: int | None, window_s: float) -> dict[str, Any]:
        """The results file's `server_metrics` of a level (docs/results_schema.md)."""
        start = self.times_ns[0] if window_start_ns is None and self.times_ns else window_start_ns or 0
        end = start + int(window_s * 1e9)
        names = sorted({name for values in self.values for name in values})
        return {
            "interval_s": self.interval_s,
            "adapter": self.last.adapter if self.last else None,
            "metric_count": self.last.metric_count if self.last else None,
            "scrapes": len(self.times_ns), "failed_scrapes": self.failed, "errors": self.errors,
            "series": {"t_s": [round((t - start) / 1e9, 3) for t in self.times_ns],
                       **{name: [values.get(name) for values in self.values] for name in names}},
            "window": self._window(start, end, names),
            "raw_first": self.first.raw if self.first else None,
            "raw_last": self.last.raw if self.last is not self.first and self.last else None,
        }

    def _window(self, start: int, end: int, names: list[str]) -> dict[str, Any]:
        inside = [i for i, t in enumerate(self.times_ns) if start <= t <= end]
        before = [i for i, t in enumerate(self.times_ns) if t <= start]
        base = before[-1] if before else (inside[0] if inside else None)
        out: dict[str, Any] = {}
        for name in names:
            if name in GAUGES:
                seen = [v for i in inside if (v := self.values[i].get(name)) is not None]
                out[name] = {"mean": round(sum(seen) / len(seen), 6), "max": max(seen)} if seen else None
            elif base is not None:
                first, last = self.values[base].get(name), self.values[-1].get(name)
                out[name] = None if first is None or last is None else round(last - first, 6)
        hits, queries = out.get("prefix_cache_hits"), out.get("prefix_cache_queries")
        out["prefix_cache_hit_rate"] = round(hits / queries, 6) if hits is not None and queries else None
        return out
