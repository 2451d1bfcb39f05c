"""The typed message interface between the API process and the engine core.

The API process (or the in-process benchmark transport) sends `AddRequest` and `AbortRequest`;
the engine core answers once per step with `StepOutputs`, which batches every request's new
tokens from that step together with engine statistics. Everything here is a dataclass of
built-in types, so it pickles across a local pipe.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    # Speculative decoding: per-request synthetic acceptance length (our extension field).
    acceptance_length: float | None = None


@dataclass(frozen=True, slots=True)
class AddRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    arrival_time: float  # time.monotonic() in the sender's clock, for queueing metrics


@dataclass(frozen=True, slots=True)
class AbortRequest:
    request_id: str


@dataclass(slots=True)
class RequestOutput:
    """One request's progress in one engine step. The engine builds and pickles one per running
    request per step, on the host's critical path, so this one is not frozen (a frozen dataclass
    sets each field through object.__setattr__, several times slower to unpickle) and pickles as
    its field values."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None = None  # "length", "stop", "abort" or "error"
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_draft_tokens: int = 0  # cumulative speculative drafts proposed for this request
    num_accepted_tokens: int = 0  # cumulative drafts accepted
    error: str | None = None
    num_drafts: int = 0  # cumulative verify steps that checked drafts (AL = 1 + accepted / this)

    def __reduce__(self) -> tuple[type[RequestOutput], tuple]:
        return RequestOutput, tuple(getattr(self, name) for name in self.__slots__)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counters are cumulative since start; gauges are as of the end of the step."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of which found
    num_preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_position: tuple[int, ...] = ()
    kernel_compiles: int = 0  # Triton kernels compiled while serving (server/engine/warmup.py)
    step_time_s: float = 0.0


@dataclass(frozen=True, slots=True)
class StepOutputs:
    outputs: tuple[RequestOutput, ...]
    stats: EngineStats = field(default_factory=EngineStats)
