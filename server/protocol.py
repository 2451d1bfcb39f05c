"""The OpenAI wire format: request JSON -> typed, validated parameters, and the response bodies.

Validation is strict about types (a bool is not an int, a string is not a number) and refuses
options the engine cannot honour (n > 1, logprobs, stop strings, penalties...) instead of
ignoring them, so a benchmark never silently measures something other than what it asked for.
Options the engine cannot honour are validated like vLLM validates them (`top_k: -5` is
`invalid_value`) and then refused unless neutral (`top_k: 50` is `unsupported_option`). Unknown
fields are ignored, as vLLM and OpenAI-compatible servers do, and listed in the response header
`X-Ignored-Fields` (escaped to visible ASCII and bounded: see `ignored_fields_header`). A
temperature below `GREEDY_TEMPERATURE` is greedy, as in vLLM. Every refusal is an `ApiError`
(400) whose OpenAI-style body names the offending parameter. Without max_tokens, a completion's
default of 16 (a chat's whole context) is clamped to the room the prompt leaves.

Extension fields (read only by our server): request `acceptance_length` (this request's
synthetic speculative acceptance length, in [1, k+1]; refused unless the server runs synthetic
speculative decoding); response `choices[i].token_ids` (the generated ids of that chunk or
response, including special ids that produce no text); `usage.spec_decode` = {num_drafts
(verify steps that checked drafts), num_draft_tokens, num_accepted_tokens} for the request, only
when the server speculates (measured AL = 1 + num_accepted_tokens / num_drafts); /v1/models
`speculative` = {method, num_speculative_tokens, rejection_sample_method,
synthetic_acceptance_length (the server's default mean AL, null for `standard`)} or null.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

from server.config import SpeculativeConfig
from server.engine.messages import SamplingParams
from server.tokenizer import ChatMessage

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})

# Options the engine cannot honour (OpenAI's and vLLM's names): each is first checked for a
# valid value (a bad one is `invalid_value`, as vLLM refuses it), then accepted only with a value
# that asks for nothing (anything else is `unsupported_option`). `None` is always neutral.
_UNSUPPORTED_OPTIONS: dict[str, tuple[Callable[[Any], str | None], tuple[Any, ...]]] = {}


def _json_type(value: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
             dict: "object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _unsupported(names: str, check: Callable[[Any], str | None], *neutral: Any) -> None:
    for name in names.split():
        _UNSUPPORTED_OPTIONS[name] = (check, (None, *neutral))


def _int_at_least(low: int, high: int | None = None) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        ok = type(v) is int and v >= low and (high is None or v <= high)
        return None if ok else f"must be an integer {'>= ' + str(low) if high is None else f'in [{low}, {high}]'}"
    return check


def _number_in(low: float, high: float) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        ok = type(v) in (int, float) and math.isfinite(v) and low <= v <= high
        return None if ok else f"must be a number in [{low:g}, {high:g}]"
    return check


def _positive_number(v: Any) -> str | None:
    return None if type(v) in (int, float) and math.isfinite(v) and v > 0 else "must be a number > 0"


def _is(kind: type) -> Callable[[Any], str | None]:
    name = _json_type(kind())
    return lambda v: None if type(v) is kind else f"must be {'an' if name[0] in 'aeiou' else 'a'} {name}"


def _top_k(v: Any) -> str | None:
    return None if type(v) is int and v >= -1 else "must be an integer: -1 or 0 (no limit) or >= 1"


def _logprobs(v: Any) -> str | None:  # completions: 0..20 candidates; chat: a boolean
    if type(v) is bool or (type(v) is int and 0 <= v <= 20):
        return None
    return "must be a boolean or an integer in [0, 20]"


def _stop(v: Any) -> str | None:
    ok = type(v) is str or (type(v) is list and all(type(x) is str for x in v))
    return None if ok else "must be a string or an array of strings"


def _int_list(v: Any) -> str | None:
    ok = type(v) is list and all(type(x) is int and x >= 0 for x in v)
    return None if ok else "must be an array of non-negative integers"


_unsupported("n best_of", _int_at_least(1), 1)
_unsupported("logprobs", _logprobs, False, 0)
_unsupported("top_logprobs", _int_at_least(0, 20), 0)
_unsupported("prompt_logprobs", _int_at_least(0))
_unsupported("echo use_beam_search include_stop_str_in_output", _is(bool), False)
_unsupported("suffix", _is(str), "")
_unsupported("stop", _stop, "", [])
_unsupported("stop_token_ids allowed_token_ids", _int_list, [])
_unsupported("bad_words", _stop, [])
_unsupported("presence_penalty frequency_penalty", _number_in(-2, 2), 0, 0.0)
_unsupported("repetition_penalty length_penalty", _positive_number, 1, 1.0)
_unsupported("top_k", _top_k, -1, 0)
_unsupported("min_p", _number_in(0, 1), 0, 0.0)
_unsupported("truncate_prompt_tokens", _int_at_least(-1))
_unsupported("logit_bias", _is(dict), {})
_unsupported("tools functions", _is(list), [])
_unsupported("response_format", _is(dict), {"type": "text"})
_unsupported("guided_json guided_regex guided_choice guided_grammar structured_outputs", lambda v: None)

# Fields that change nothing about the tokens generated: accepted without a check.
_INERT_FIELDS = frozenset({"user", "metadata", "store", "service_tier", "request_id", "priority",
                           "tool_choice", "parallel_tool_calls", "function_call", "skip_special_tokens",
                           "spaces_between_special_tokens", "add_special_tokens", "cache_salt"})
# Everything either endpoint reads; any other field is unknown: ignored, as vLLM does, and named
# in the response header IGNORED_FIELDS_HEADER so that the client can see what had no effect.
_OPTION_FIELDS = frozenset({"model", "min_tokens", "ignore_eos", "temperature", "top_p", "seed", "stream",
                            "stream_options", "acceptance_length"}) | _INERT_FIELDS | frozenset(_UNSUPPORTED_OPTIONS)
_COMPLETION_FIELDS = _OPTION_FIELDS | {"prompt", "max_tokens"}
_CHAT_FIELDS = _OPTION_FIELDS | {"messages", "max_tokens", "max_completion_tokens"}
IGNORED_FIELDS_HEADER = "X-Ignored-Fields"
# The header lists this many names at most, each cut to this many characters: a body may hold
# any number of unknown fields, of any length, and a response header must stay small.
MAX_IGNORED_NAMES = 16
MAX_IGNORED_NAME_CHARS = 80
# vLLM's bound: a lower temperature is greedy (dividing the logits by it could overflow float32).
GREEDY_TEMPERATURE = 1e-5


class ErrorCode(str, Enum):
    """The `code` of an OpenAI-style error body (and the label of agentload:requests_rejected_total);
    a member is a str equal to its value."""

    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    REQUEST_TOO_LARGE = "request_too_large"
    INVALID_API_KEY = "invalid_api_key"
    MODEL_NOT_FOUND = "model_not_found"
    ENGINE_DEAD = "engine_dead"
    SHUTTING_DOWN = "shutting_down"
    OVERLOADED = "overloaded"
    ENGINE_REFUSED = "engine_refused"
    INVALID_VALUE = "invalid_value"
    INVALID_JSON = "invalid_json"
    UNSUPPORTED_OPTION = "unsupported_option"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    REQUEST_TIMEOUT = "request_timeout"
    SERVER_SHUTDOWN = "server_shutdown"
    INVALID_HTTP = "invalid_http_request"
    INTERNAL_ERROR = "internal_error"

    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]  # str's, not Enum's


class ApiError(Exception):
    """A request refused with an HTTP status and an OpenAI-style error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: ErrorCode | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: ErrorCode | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


def _invalid(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param, code=ErrorCode.INVALID_VALUE)


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
    return CompletionRequest(options, _parse_prompt(obj.get("prompt")), _unknown(obj, _COMPLETION_FIELDS))


def parse_chat_request(body: bytes) -> ChatRequest:
    obj = _load_object(body)
    options = _parse_options(
        obj, max_tokens_keys=("max_completion_tokens", "max_tokens"), default_max_tokens=None
    )
    return ChatRequest(options, _parse_messages(obj.get("messages")), _unknown(obj, _CHAT_FIELDS))


def _unknown(obj: dict[str, Any], known: frozenset[str]) -> tuple[str, ...]:
    return tuple(sorted(key for key in obj if key not in known))


def ignored_fields_header(names: tuple[str, ...]) -> str:
    """The IGNORED_FIELDS_HEADER value: the first MAX_IGNORED_NAMES names, comma-separated, each as
    `_visible` writes it, then `(N more)` if some were left out. A JSON key may hold any character,
    but a header value must not hold CR, LF or NUL (aiohttp refuses to send one)."""
    shown = [_visible(name) for name in names[:MAX_IGNORED_NAMES]]
    if len(names) > len(shown):
        shown.append(f"({len(names) - len(shown)} more)")  # the space tells it from a name
    return ", ".join(shown)


def _visible(name: str) -> str:
    """`name` in visible ASCII: any other character, a backslash or a comma (the separator) as a
    Python escape (`\\x0d`, `\\u00e9`, ...); cut to MAX_IGNORED_NAME_CHARS characters, with `...`."""
    out: list[str] = []
    size = 0
    for char in name:
        piece = char if "!" <= char <= "~" and char not in "\\," else _escape(char)
        if size + len(piece) > MAX_IGNORED_NAME_CHARS:
            return "".join(out) + "..."
        out.append(piece)
        size += len(piece)
    return "".join(out)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


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
    for name, (check, neutral) in _UNSUPPORTED_OPTIONS.items():
        if obj.get(name) is None:
            continue
        problem = check(obj[name])
        if problem is not None:
            raise _invalid(name, f"{problem}, got {_shown(obj[name])}")
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
        raise _invalid("min_tokens", f"{min_tokens} exceeds max_tokens {max_tokens}")
    stream = _bool(obj, "stream", False)
    include_usage = False
    stream_options = obj.get("stream_options")
    if stream_options is not None:
        if not stream:
            raise _invalid("stream_options", "only allowed when stream is true")
        if not isinstance(stream_options, dict):
            raise _invalid("stream_options", "must be an object")
        include_usage = _bool(stream_options, "include_usage", False, prefix="stream_options.")
    temperature = _number(obj, "temperature", 1.0)
    if temperature < 0:
        raise _invalid("temperature", f"must be >= 0, got {temperature}")
    if temperature < GREEDY_TEMPERATURE:
        temperature = 0.0
    top_p = _number(obj, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise _invalid("top_p", f"must be in (0, 1], got {top_p}")
    acceptance_length = None
    if obj.get("acceptance_length") is not None:
        acceptance_length = _number(obj, "acceptance_length", 1.0)
        if acceptance_length < 1:
            raise _invalid("acceptance_length", f"must be >= 1, got {acceptance_length}")
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise _invalid("model", "must be a string")
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
        raise _invalid(key, f"must be an integer, got {_json_type(value)}")
    if minimum is not None and value < minimum:
        raise _invalid(key, f"must be >= {minimum}, got {value}")
    return value


def _number(obj: dict[str, Any], key: str, default: float) -> float:
    value = obj.get(key)
    if value is None:
        return default
    if type(value) not in (int, float) or not math.isfinite(value):
        raise _invalid(key, f"must be a finite number, got {_json_type(value)}")
    return float(value)


def _bool(obj: dict[str, Any], key: str, default: bool, prefix: str = "") -> bool:
    value = obj.get(key)
    if value is None:
        return default
    if type(value) is not bool:
        raise _invalid(prefix + key, f"must be a boolean, got {_json_type(value)}")
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
            raise _invalid("prompt", "must not be empty")
        return prompt
    if isinstance(prompt, list):
        if not prompt:
            raise _invalid("prompt", "must not be empty")
        for i, token in enumerate(prompt):
            if type(token) is not int or token < 0:
                raise _invalid("prompt", f"token id at index {i} must be a non-negative integer")
        return tuple(prompt)
    if prompt is None:
        raise _invalid("prompt", "is required")
    raise _invalid("prompt", f"must be a string or an array of token ids, got {_json_type(prompt)}")


def _parse_messages(messages: Any) -> tuple[ChatMessage, ...]:
    if messages is None:
        raise _invalid("messages", "is required")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages", "must be a non-empty array")
    return tuple(_parse_message(i, m) for i, m in enumerate(messages))


def _parse_message(index: int, message: Any) -> ChatMessage:
    param = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _invalid(param, "must be an object")
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise _invalid(f"{param}.role", f"must be one of {sorted(CHAT_ROLES)}, got {role!r}")
    content = message.get("content")
    if content is None and role == "assistant":
        content = ""
    if isinstance(content, list):
        content = "".join(_text_part(f"{param}.content[{j}]", p) for j, p in enumerate(content))
    if not isinstance(content, str):
        raise _invalid(f"{param}.content", "must be a string or an array of text parts")
    return ChatMessage(role, content)


def _text_part(param: str, part: Any) -> str:
    if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
        raise ApiError(400, f"{param}: only text parts ({{'type': 'text', 'text': ...}}) are supported",
                       param=param, code=ErrorCode.UNSUPPORTED_OPTION)
    return part["text"]


def check_prompt(token_ids: tuple[int, ...], vocab_size: int) -> None:
    bad = next((t for t in token_ids if t >= vocab_size), None)
    if bad is not None:
        raise _invalid("prompt", f"token id {bad} is outside the vocabulary (size {vocab_size})")


def resolve_max_tokens(options: GenerationOptions, prompt_len: int, max_model_len: int,
                       prompt_param: str = "prompt") -> int:
    """The number of tokens to generate. A max_tokens the client sent must fit beside the prompt
    (refused, never truncated); the default (16 for completions, the whole context for chat) is
    clamped to the room the prompt leaves, as OpenAI-compatible servers do."""
    room = max_model_len - prompt_len
    if options.max_tokens_is_default:
        if room < 1:
            raise ApiError(400, f"{prompt_param}: the prompt has {prompt_len} tokens; the model's context is "
                           f"{max_model_len} tokens, leaving no room to generate",
                           param=prompt_param, code=ErrorCode.CONTEXT_LENGTH_EXCEEDED)
        limit = room if options.max_tokens is None else min(options.max_tokens, room)
        if options.min_tokens > limit:
            raise ApiError(400, f"min_tokens ({options.min_tokens}) exceeds the {room} tokens left in "
                           f"the model's context after the prompt ({prompt_len} tokens)",
                           param="min_tokens", code=ErrorCode.CONTEXT_LENGTH_EXCEEDED)
        return limit
    if options.max_tokens > room:
        raise ApiError(400, f"prompt ({prompt_len} tokens) + max_tokens ({options.max_tokens}) "
                       f"exceeds the model's context of {max_model_len} tokens",
                       param="max_tokens", code=ErrorCode.CONTEXT_LENGTH_EXCEEDED)
    return options.max_tokens


def check_acceptance_length(options: GenerationOptions, speculative: SpeculativeConfig | None) -> None:
    """The per-request AL override only means something to synthetic acceptance; the engine
    checks its range against k."""
    if options.acceptance_length is None:
        return
    if speculative is None or not speculative.synthetic:
        raise ApiError(400, "acceptance_length: this server does not run synthetic speculative decoding "
                       "(start it with --speculative-config ... rejection_sample_method 'synthetic')",
                       param="acceptance_length", code=ErrorCode.UNSUPPORTED_OPTION)


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
