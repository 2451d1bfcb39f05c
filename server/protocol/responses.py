"""Response bodies: a whole response, the SSE chunks of a stream, usage, and the /v1/models
extension that describes the server's speculative decoding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from server.config import SpeculativeConfig
from server.protocol.errors import ApiError


def speculative_card(speculative: SpeculativeConfig | None) -> dict[str, Any] | None:
    """The /v1/models extension that tells a client k and the server's default AL."""
    if speculative is None:
        return None
    rates = speculative.acceptance_rates
    return {"method": speculative.method, "num_speculative_tokens": speculative.num_speculative_tokens,
            "rejection_sample_method": speculative.rejection_sample_method,
            "synthetic_acceptance_length": round(1 + sum(rates), 6) if speculative.synthetic else None}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int,
          spec_decode: dict[str, int] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    if spec_decode is not None:
        body["spec_decode"] = spec_decode
    return body


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    """What every response body and chunk of one request repeats."""

    id: str
    created: int
    model: str
    chat: bool

    def full(self, text: str, token_ids: list[int], finish_reason: str | None,
             usage_: dict[str, Any]) -> bytes:
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason=finish_reason, token_ids=token_ids)
        obj = "chat.completion" if self.chat else "text_completion"
        return orjson.dumps({"id": self.id, "object": obj, "created": self.created,
                             "model": self.model, "choices": [choice], "usage": usage_})

    def chunk(self, text: str, token_ids: tuple[int, ...], finish_reason: str | None,
              first: bool, with_usage_field: bool) -> bytes:
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason=finish_reason, token_ids=token_ids)
        body: dict[str, Any] = {"id": self.id, "object": self._chunk_object(),
                                "created": self.created, "model": self.model, "choices": [choice]}
        if with_usage_field:
            body["usage"] = None
        return b"data: " + orjson.dumps(body) + b"\n\n"

    def usage_chunk(self, usage_: dict[str, Any]) -> bytes:
        body = {"id": self.id, "object": self._chunk_object(), "created": self.created,
                "model": self.model, "choices": [], "usage": usage_}
        return b"data: " + orjson.dumps(body) + b"\n\n"

    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"


SSE_DONE = b"data: [DONE]\n\n"


def sse_error(error: ApiError) -> bytes:
    return b"data: " + error.body() + b"\n\n"
