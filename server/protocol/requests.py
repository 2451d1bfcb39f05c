"""Request JSON -> typed, validated parameters: the two endpoints' bodies, and the checks that need
the model (vocabulary, context length, speculative decoding)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

from server.config import SpeculativeConfig
from server.engine.messages import SamplingParams
from server.protocol.errors import ApiError, ErrorCode, invalid, json_type
from server.protocol.fields import CHAT_FIELDS, COMPLETION_FIELDS, UNSUPPORTED_OPTIONS, unknown_fields
from server.tokenizer import ChatMessage

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
# vLLM's bound: a lower temperature is greedy (dividing the logits by it could overflow float32).
GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True, slots=True)
class GenerationOptions:
    """The sampling and streaming options shared by both endpoints."""

    model: str | None
    max_tokens: int | None  # None: up to the model's context
    max_tokens_is_default: bool  # not sent: clamped to the room the prompt leaves
    min_tokens: int
    ignore_eos: bool
    temperature: float
    top_p: float
    seed: int | None
    stream: bool
    include_usage: bool
    acceptance_length: float | None

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            acceptance_length=self.acceptance_length,
        )


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    options: GenerationOptions
    prompt: str | tuple[int, ...]  # text, or token ids sent as they are
    ignored_fields: tuple[str, ...] = ()  # unknown top-level fields, sorted


@dataclass(frozen=True, slots=True)
class ChatRequest:
    options: GenerationOptions
    messages: tuple[ChatMessage, ...]
    ignored_fields: tuple[str, ...] = ()


def parse_completion_request(body: bytes) -> CompletionRequest:
    obj = _load_object(body)
    options = _parse_options(obj, max_tokens_keys=("max_tokens",), default_max_tokens=16)
    return CompletionRequest(options, _parse_prompt(obj.get("prompt")), unknown_fields(obj, COMPLETION_FIELDS))


def parse_chat_request(body: bytes) -> ChatRequest:
    obj = _load_object(body)
    options = _parse_options(
        obj, max_tokens_keys=("max_completion_tokens", "max_tokens"), default_max_tokens=None
    )
    return ChatRequest(options, _parse_messages(obj.get("messages")), unknown_fields(obj, CHAT_FIELDS))


def _load_object(body: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", code=ErrorCode.INVALID_JSON) from None
    if not isinstance(obj, dict):
        raise ApiError(400, "request body must be a JSON object", code=ErrorCode.INVALID_JSON)
    return obj


def _parse_options(
    obj: dict[str, Any], *, max_tokens_keys: tuple[str, ...], default_max_tokens: int | None
) -> GenerationOptions:
    for name, (check, neutral) in UNSUPPORTED_OPTIONS.items():
        if obj.get(name) is None:
            continue
        problem = check(obj[name])
        if problem is not None:
            raise invalid(name, f"{problem}, got {_shown(obj[name])}")
        if not _is_neutral(obj[name], neutral):
            raise ApiError(400, f"{name}: not supported by this server (got {_shown(obj[name])})",
                           param=name, code=ErrorCode.UNSUPPORTED_OPTION)
    max_tokens = default_max_tokens
    max_tokens_is_default = True
    for key in max_tokens_keys:
        if obj.get(key) is not None:
            max_tokens = _int(obj, key, minimum=1)
            max_tokens_is_default = False
            break
    min_tokens = _int(obj, "min_tokens", minimum=0) if obj.get("min_tokens") is not None else 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise invalid("min_tokens", f"{min_tokens} exceeds max_tokens {max_tokens}")
    stream = _bool(obj, "stream", False)
    include_usage = False
    stream_options = obj.get("stream_options")
    if stream_options is not None:
        if not stream:
            raise invalid("stream_options", "only allowed when stream is true")
        if not isinstance(stream_options, dict):
            raise invalid("stream_options", "must be an object")
        include_usage = _bool(stream_options, "include_usage", False, prefix="stream_options.")
    temperature = _number(obj, "temperature", 1.0)
    if temperature < 0:
        raise invalid("temperature", f"must be >= 0, got {temperature}")
    if temperature < GREEDY_TEMPERATURE:
        temperature = 0.0
    top_p = _number(obj, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise invalid("top_p", f"must be in (0, 1], got {top_p}")
    acceptance_length = None
    if obj.get("acceptance_length") is not None:
        acceptance_length = _number(obj, "acceptance_length", 1.0)
        if acceptance_length < 1:
            raise invalid("acceptance_length", f"must be >= 1, got {acceptance_length}")
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid("model", "must be a string")
    return GenerationOptions(
        model=model,
        max_tokens=max_tokens,
        max_tokens_is_default=max_tokens_is_default,
        min_tokens=min_tokens,
        ignore_eos=_bool(obj, "ignore_eos", False),
        temperature=temperature,
        top_p=top_p,
        # orjson reads integers outside [-2^63, 2^64) (what a torch generator takes) as floats,
        # so an integer check here also keeps out-of-range seeds from the engine.
        seed=_int(obj, "seed") if obj.get("seed") is not None else None,
        stream=stream,
        include_usage=include_usage,
        acceptance_length=acceptance_length,
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_neutral(value: Any, neutrals: tuple[Any, ...]) -> bool:
    # Compare types too: in Python `False == 0`, but `logprobs: 0` and `n: true` differ on the wire.
    return any(type(value) is type(n) and value == n for n in neutrals)


def _int(obj: dict[str, Any], key: str, minimum: int | None = None) -> int:
    value = obj[key]
    if type(value) is not int:
        raise invalid(key, f"must be an integer, got {json_type(value)}")
    if minimum is not None and value < minimum:
        raise invalid(key, f"must be >= {minimum}, got {value}")
    return value


def _number(obj: dict[str, Any], key: str, default: float) -> float:
    value = obj.get(key)
    if value is None:
        return default
    if type(value) not in (int, float) or not math.isfinite(value):
        raise invalid(key, f"must be a finite number, got {json_type(value)}")
    return float(value)


def _bool(obj: dict[str, Any], key: str, default: bool, prefix: str = "") -> bool:
    value = obj.get(key)
    if value is None:
        return default
    if type(value) is not bool:
        raise invalid(prefix + key, f"must be a boolean, got {json_type(value)}")
    return value


def _parse_prompt(prompt: Any) -> str | tuple[int, ...]:
    # A batch of exactly one prompt is accepted in either list form.
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        raise ApiError(400, "prompt: batches of several prompts are not supported",
                       param="prompt", code=ErrorCode.UNSUPPORTED_OPTION)
    if isinstance(prompt, str):
        if not prompt:
            raise invalid("prompt", "must not be empty")
        return prompt
    if isinstance(prompt, list):
        if not prompt:
            raise invalid("prompt", "must not be empty")
        for i, token in enumerate(prompt):
            if type(token) is not int or token < 0:
                raise invalid("prompt", f"token id at index {i} must be a non-negative integer")
        return tuple(prompt)
    if prompt is None:
        raise invalid("prompt", "is required")
    raise invalid("prompt", f"must be a string or an array of token ids, got {json_type(prompt)}")


def _parse_messages(messages: Any) -> tuple[ChatMessage, ...]:
    if messages is None:
        raise invalid("messages", "is required")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "must be a non-empty array")
    return tuple(_parse_message(i, m) for i, m in enumerate(messages))


def _parse_message(index: int, message: Any) -> ChatMessage:
    param = f"messages[{index}]"
    if not isinstance(message, dict):
        raise invalid(param, "must be an object")
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise invalid(f"{param}.role", f"must be one of {sorted(CHAT_ROLES)}, got {role!r}")
    content = message.get("content")
    if content is None and role == "assistant":
        content = ""
    if isinstance(content, list):
        content = "".join(_text_part(f"{param}.content[{j}]", p) for j, p in enumerate(content))
    if not isinstance(content, str):
        raise invalid(f"{param}.content", "must be a string or an array of text parts")
    return ChatMessage(role, content)


def _text_part(param: str, part: Any) -> str:
    if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
        raise ApiError(400, f"{param}: only text parts ({{'type': 'text', 'text': ...}}) are supported",
                       param=param, code=ErrorCode.UNSUPPORTED_OPTION)
    return part["text"]


def check_prompt(token_ids: tuple[int, ...], vocab_size: int) -> None:
    bad = next((t for t in token_ids if t >= vocab_size), None)
    if bad is not None:
        raise invalid("prompt", f"token id {bad} is outside the vocabulary (size {vocab_size})")


def resolve_max_tokens(options: GenerationOptions, prompt_len: int, max_model_len: int,
                       prompt_param: str = "prompt") -> int:
    """The number of tokens to generate. A max_tokens the client sent must fit beside the prompt
    (refused, never truncated); the default (16 for completions, the whole context for chat) is
    clamped to the room the prompt leaves, as OpenAI-compatible servers do."""
    room = max_model_len - prompt_len
    max_tokens = options.max_tokens
    if options.max_tokens_is_default or max_tokens is None:  # None (chat's default): the whole context
        if room < 1:
            raise ApiError(400, f"{prompt_param}: the prompt has {prompt_len} tokens; the model's context is "
                           f"{max_model_len} tokens, leaving no room to generate",
                           param=prompt_param, code=ErrorCode.CONTEXT_LENGTH_EXCEEDED)
        limit = room if max_tokens is None else min(max_tokens, room)
        if options.min_tokens > limit:
            raise ApiError(400, f"min_tokens ({options.min_tokens}) exceeds the {room} tokens left in "
                           f"the model's context after the prompt ({prompt_len} tokens)",
                           param="min_tokens", code=ErrorCode.CONTEXT_LENGTH_EXCEEDED)
        return limit
    if max_tokens > room:
        raise ApiError(400, f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) "
                       f"exceeds the model's context of {max_model_len} tokens",
                       param="max_tokens", code=ErrorCode.CONTEXT_LENGTH_EXCEEDED)
    return max_tokens


def check_acceptance_length(options: GenerationOptions, speculative: SpeculativeConfig | None) -> None:
    """The per-request AL override only means something to synthetic acceptance; the engine
    checks its range against k."""
    if options.acceptance_length is None:
        return
    if speculative is None or not speculative.synthetic:
        raise ApiError(400, "acceptance_length: this server does not run synthetic speculative decoding "
                       "(start it with --speculative-config ... rejection_sample_method 'synthetic')",
                       param="acceptance_length", code=ErrorCode.UNSUPPORTED_OPTION)
