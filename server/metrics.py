"""Prometheus text exposition (format 0.0.4) of the server's metrics, with vLLM's names.

Engine counters and gauges come from the latest `EngineStats` the engine process sent (its
counters are cumulative, so exporting the latest snapshot is exact). Request latencies are
measured in the API process when each step's output arrives from the engine: TTFT from the
request's arrival, inter-token latency between consecutive outputs of one request (one engine
step may carry several tokens with speculative decoding), end-to-end latency at the last output.
The engine's GPUs' readings (agentload:gpu_*, labelled by NVML index and model) are read at scrape time,
off the event loop (server/gpu_metrics.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from server.engine.messages import EngineStats
from server.gpu_metrics import GPU_METRICS, GpuSamples

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
               1.0, 2.5, 5.0, 10.0, 20.0, 80.0)
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

# (metric name, EngineStats field, help text)
_ENGINE_GAUGES = (
    ("vllm:num_requests_running", "num_running", "Requests in the running batch."),
    ("vllm:num_requests_waiting", "num_waiting", "Requests waiting to be scheduled."),
    ("vllm:kv_cache_usage_perc", "kv_cache_usage", "Fraction of KV cache blocks in use (1 = full)."),
)
_ENGINE_COUNTERS = (
    ("vllm:prefix_cache_queries_total", "prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
    ("vllm:prefix_cache_hits_total", "prefix_cache_hits", "Prompt tokens found in the prefix cache."),
    ("vllm:prompt_tokens_total", "prompt_tokens", "Prompt tokens processed (prefill)."),
    ("vllm:generation_tokens_total", "generation_tokens", "Tokens generated."),
    ("vllm:num_preemptions_total", "num_preemptions", "Preemptions (recompute) of running requests."),
    ("vllm:spec_decode_num_drafts_total", "spec_num_drafts", "Speculative verify steps."),
    ("vllm:spec_decode_num_draft_tokens_total", "spec_num_draft_tokens", "Draft tokens proposed."),
    ("vllm:spec_decode_num_accepted_tokens_total", "spec_num_accepted_tokens", "Draft tokens accepted."),
    ("agentload:kernel_compiles_total", "kernel_compiles",
     "Triton kernels compiled while serving, after the start-up warm-up: each stalled the requests of its step."),
)


class Histogram:
    """Cumulative-bucket histogram; `observe` is a bisect and two additions."""

    __slots__ = ("buckets", "counts", "sum", "count")

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last slot is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = []
        cumulative = 0
        bounds: tuple[float | str, ...] = (*self.buckets, "+Inf")
        for bound, n in zip(bounds, self.counts):
            cumulative += n
            le = bound if isinstance(bound, str) else _number(bound)
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {cumulative}')
        out.append(f"{name}_sum{{{labels}}} {_number(self.sum)}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


class ServerMetrics:
    """Everything /metrics exports for one served model."""

    def __init__(self, model_name: str) -> None:
        self._labels = f'model_name="{_escape(model_name)}"'
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.request_success: dict[str, int] = {}
        self.requests_rejected: dict[str, int] = {}

    def observe_finished(self, finish_reason: str) -> None:
        self.request_success[finish_reason] = self.request_success.get(finish_reason, 0) + 1

    def observe_rejected(self, code: str) -> None:
        self.requests_rejected[code] = self.requests_rejected.get(code, 0) + 1

    def render(self, stats: EngineStats, api_requests_in_flight: int, gpus: GpuSamples | None = None) -> bytes:
        """gpus: the engine's GPUs' readings (server/gpu_metrics.py), None where there are none."""
        lines: list[str] = []
        for name, field, help_text in _ENGINE_GAUGES:
            self._family(lines, name, "gauge", help_text)
            lines.append(f"{name}{{{self._labels}}} {_number(getattr(stats, field))}")
        for name, field, help_text in _ENGINE_COUNTERS:
            self._family(lines, name, "counter", help_text)
            lines.append(f"{name}{{{self._labels}}} {getattr(stats, field)}")
        name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
        self._family(lines, name, "counter", "Draft tokens accepted at each draft position.")
        for pos, n in enumerate(stats.spec_accepted_per_position):
            lines.append(f'{name}{{{self._labels},position="{pos}"}} {n}')
        for name, hist, help_text in (
            ("vllm:time_to_first_token_seconds", self.ttft, "Request arrival to first token."),
            ("vllm:inter_token_latency_seconds", self.itl,
             "Gap between consecutive engine outputs of one request (one step may carry several tokens)."),
            ("vllm:e2e_request_latency_seconds", self.e2e, "Request arrival to last token."),
        ):
            self._family(lines, name, "histogram", help_text)
            lines.extend(hist.lines(name, self._labels))
        self._labelled_counter(lines, "vllm:request_success_total", "finished_reason",
                               self.request_success, "Requests finished, by finish reason.")
        self._labelled_counter(lines, "agentload:requests_rejected_total", "code",
                               self.requests_rejected, "Requests refused before reaching the engine, by error code.")
        name = "agentload:api_requests_in_flight"
        self._family(lines, name, "gauge", "Requests accepted by the API and not yet finished.")
        lines.append(f"{name}{{{self._labels}}} {api_requests_in_flight}")
        for name, kind, help_text in GPU_METRICS:
            if gpus and gpus.get(name):
                self._family(lines, name, kind, help_text)
                lines.extend(f'{name}{{gpu="{index}",name="{_escape(gpu_name)}"}} {_number(value)}'
                             for index, gpu_name, value in gpus[name])
        return ("\n".join(lines) + "\n").encode()

    def _labelled_counter(self, lines: list[str], name: str, label: str,
                          counts: dict[str, int], help_text: str) -> None:
        self._family(lines, name, "counter", help_text)
        for key, n in sorted(counts.items()):
            lines.append(f'{name}{{{self._labels},{label}="{_escape(key)}"}} {n}')

    @staticmethod
    def _family(lines: list[str], name: str, kind: str, help_text: str) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
