"""The results-file entry of one level (`level_summary`), the per-request records
(`request_record`), and the trace's theoretical prefix-cache hit rate over what was measured
(`TraceHitRates`). Schema: loadgen/results/file.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from loadgen.results.attainment import good_mask, level_attainment, request_columns
from loadgen.results.turns import turn_summary
from loadgen.run.level import LevelRun, RequestMeta, RunConfig
from loadgen.run.loop_lag import WARN_P99_US
from loadgen.run.spec_decode import SpecExpectation
from loadgen.transport.base import Exchange
from traces import Session, TraceSet


class TraceHitRates:
    """The trace's infinite-cache hit rate over a level's measured sessions, cached per session."""

    def __init__(self, traces: TraceSet, theoretical_hit: Callable[[Session], float]) -> None:
        self._sessions = {s.id: s for s in traces.sessions}
        self._theoretical_hit = theoretical_hit
        self._cache: dict[str, float] = {}

    def of(self, level: LevelRun) -> float | None:
        """Weighted by the measured input tokens of each session. Computed after the window: it is
        slow on long sessions."""
        if not level.input_tokens:
            return None
        weighted = 0.0
        for session_id, tokens in level.session_input_tokens.items():
            if session_id not in self._cache:
                self._cache[session_id] = self._theoretical_hit(self._sessions[session_id])
            weighted += tokens * self._cache[session_id]
        return round(weighted / level.input_tokens, 6)


# Involuntary context switches per second and worker above which a lagging loop is blamed on a
# shared core: a client alone on its core is rarely preempted, one whose core a CPU-bound process
# shares is preempted several times as often as this (`benchmarks/client_overhead.py` reports
# `preempted_per_s` beside the loop lag).
WARN_PREEMPTED_PER_S = 20


def level_summary(level: LevelRun, config: RunConfig, theoretical_hit_rate: float | None,
                  spec: SpecExpectation | None = None, engine_in_process: bool = False,
                  session_turns: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The results-file entry of one level (see loadgen/results/file.py). `engine_in_process` (`loadgen bench`):
    the engine runs in this process, so its CPU time is in the process's and says nothing of
    the client alone. `session_turns` (session id -> its parent requests) says which plays the
    window saw whole."""
    window_s = level.window_s
    errors_total = sum(level.errors.values())
    attempted = level.ok + errors_total
    error_rate = errors_total / attempted if attempted else 0.0
    reasons = []
    if error_rate > config.max_error_rate:
        reasons.append(f"error rate {error_rate:.1%} > --max-error-rate {config.max_error_rate:.1%}")
    if level.ok == 0:
        reasons.append("no request completed inside the window")
    per_s = (lambda x: round(x / window_s, 3)) if window_s > 0 else (lambda x: 0.0)
    gpus = max(1, config.gpus)
    metrics = level.recorder.summary()
    lag_p99 = metrics["loop_lag"]["stats"]["p99"]
    cpu_util = level.cpu_s / window_s if level.cpu_s is not None and window_s > 0 else None
    per_worker = cpu_util / level.workers if cpu_util is not None else None
    preempted_per_s = level.preempted / window_s if level.preempted is not None and window_s > 0 else None
    warnings = []
    if lag_p99 is not None and lag_p99 > WARN_P99_US:
        warning = f"client event loop lagged (p99 {lag_p99 / 1000:.1f} ms): the client may be the bottleneck"
        if (preempted_per_s is not None and preempted_per_s / level.workers > WARN_PREEMPTED_PER_S
                and not engine_in_process):
            warning += (f"; other processes took the client's core {preempted_per_s / level.workers:.0f} times a "
                        "second per worker process: a shared core (give the client cores of its own)")
        warnings.append(warning)
    if per_worker is not None and per_worker > 0.9 and not engine_in_process:
        warnings.append(f"client used {per_worker:.0%} of a core per worker process during the window: it may "
                        "be the bottleneck (more --workers spread it over more cores)")
    return {
        "mode": level.load.mode,
        "concurrency": level.load.concurrency,
        "rate": level.load.rate,
        "label": level.load.label,
        "failed": bool(reasons),
        "fail_reasons": reasons,
        "window_s": round(window_s, 6),
        "window_start_unix": None if level.window_start_unix is None else round(level.window_start_unix, 3),
        "counts": {
            "requests_ok": level.ok,
            "errors": dict(level.errors),
            "errors_total": errors_total,
            "error_rate": round(error_rate, 6),
            "warmup_requests_ok": level.warmup_ok,
            "warmup_errors": dict(level.warmup_errors),
            "input_tokens": level.input_tokens,
            "output_tokens": level.output_tokens,
            "output_tokens_counted": level.counted_tokens,
            "usage_mismatch_requests": level.usage_mismatches,
            "max_inflight_requests": level.max_inflight,
            # requests in flight, averaged over the window: against a closed loop's concurrency it
            # says how much of the lanes' time waited on the server rather than on think time
            "mean_inflight_requests": round(level.inflight_ns / 1e9 / window_s, 4) if window_s > 0 else None,
            # our server's Triton kernels compiled from window start to after the drain (None: not reported)
            "server_kernel_compiles": level.window_kernel_compiles,
            "max_active_trees": level.max_active_trees,
        },
        "throughput": {
            "requests_per_s": per_s(level.ok),
            "input_tokens_per_s": per_s(level.input_tokens),
            "output_tokens_per_s": per_s(level.output_tokens),
            "total_tokens_per_s": per_s(level.input_tokens + level.output_tokens),
            "gpus": gpus,
            "input_tokens_per_s_per_gpu": per_s(level.input_tokens / gpus),
            "output_tokens_per_s_per_gpu": per_s(level.output_tokens / gpus),
            "total_tokens_per_s_per_gpu": per_s((level.input_tokens + level.output_tokens) / gpus),
        },
        "cache": {
            "cached_tokens": level.cached_tokens if level.cached_reported else None,
            "requests_reporting_cached": level.cached_reported,
            # over the requests that report cached tokens: the others say nothing either way
            "measured_hit_rate": round(level.cached_tokens / level.cached_input_tokens, 6)
            if level.cached_reported and level.cached_input_tokens else None,
            "trace_theoretical_hit_rate": theoretical_hit_rate,
        },
        "client": {"cpu_s": round(level.cpu_s, 4) if level.cpu_s is not None else None,
                   "cpu_sys_s": round(level.sys_s, 4) if level.sys_s is not None else None,
                   "cpu_util": round(cpu_util, 4) if cpu_util is not None else None,
                   "preempted_per_s": round(preempted_per_s, 1) if preempted_per_s is not None else None,
                   "warnings": warnings},
        "spec_decode": level.spec_tally.summary(spec),
        "metrics": metrics,
        "slo": [level_attainment(slo, level.columns, level.error_plays, window_s, gpus, config.slo_target)
                for slo in config.slos],
        # by turn, by context and per session play; the good shares against the first SLO
        "turns": turn_summary(level.columns, good_mask(config.slos[0], request_columns(level.columns))[0]
                              if config.slos else None, session_turns),
        "requests": level.columns,
        "failed_plays": level.error_plays,  # the play of each counted failed request, for the SLOs
    }


def request_record(level: LevelRun, meta: RequestMeta, wire_id: str, ex: Exchange, origin: int, counted: bool,
                    al: float | None) -> dict[str, Any]:
    """One --per-request line. Times are perf_counter_ns (CLOCK_MONOTONIC on Linux, so they
    compare with other processes' timestamps on the same host); due_ns is the intended start."""
    return {
        "level": level.load.label, "id": wire_id, "play": meta.play_id, "session": meta.session,
        "agent": meta.agent, "turn": meta.request.index, "isl": meta.request.input_tokens,
        "osl_asked": meta.request.output_tokens, "osl": ex.output_tokens, "osl_counted": ex.counted_tokens,
        "cached_tokens": ex.cached_tokens, "due_ns": origin, "start_ns": ex.start_ns,
        "first_ns": ex.chunk_ns[0] if ex.chunk_ns else None,
        "last_ns": ex.chunk_ns[-1] if ex.chunk_ns else None, "end_ns": ex.end_ns,
        "chunk_ns": ex.chunk_ns, "chunk_tokens": ex.chunk_tokens, "thinking": meta.request.thinking,
        "expected_al": al, "spec_num_drafts": ex.spec_num_drafts,
        "spec_num_accepted_tokens": ex.spec_num_accepted_tokens,
        "counted": counted and ex.error is None, "error": ex.error, "error_detail": ex.error_detail,
    }


def dumps_record(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record) + b"\n"
