"""Which request fields the server reads, which it refuses unless neutral, which change nothing,
and how the unknown ones it ignores are named in the `X-Ignored-Fields` response header."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from server.protocol.errors import json_type

# Options the engine cannot honour (OpenAI's and vLLM's names): each is first checked for a
# valid value (a bad one is `invalid_value`, as vLLM refuses it), then accepted only with a value
# that asks for nothing (anything else is `unsupported_option`). `None` is always neutral.
UNSUPPORTED_OPTIONS: dict[str, tuple[Callable[[Any], str | None], tuple[Any, ...]]] = {}


def _unsupported(names: str, check: Callable[[Any], str | None], *neutral: Any) -> None:
    for name in names.split():
        UNSUPPORTED_OPTIONS[name] = (check, (None, *neutral))


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
    name = json_type(kind())
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
                            "stream_options", "acceptance_length"}) | _INERT_FIELDS | frozenset(UNSUPPORTED_OPTIONS)
COMPLETION_FIELDS = _OPTION_FIELDS | {"prompt", "max_tokens"}
CHAT_FIELDS = _OPTION_FIELDS | {"messages", "max_tokens", "max_completion_tokens"}
IGNORED_FIELDS_HEADER = "X-Ignored-Fields"
# The header lists this many names at most, each cut to this many characters: a body may hold
# any number of unknown fields, of any length, and a response header must stay small.
MAX_IGNORED_NAMES = 16
MAX_IGNORED_NAME_CHARS = 80


def unknown_fields(obj: dict[str, Any], known: frozenset[str]) -> tuple[str, ...]:
    """The top-level fields of `obj` outside `known`, sorted: those the request had no effect with."""
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

