"""The server's request parser under a seeded, bounded property-based fuzzer (hypothesis): any body
- arbitrary bytes, JSON of any shape, OpenAI-like requests with hostile values - is either
parsed into typed parameters or refused with an ApiError of a 4xx status; no other exception, so
no 500 and no traceback can come out of it. The ignored-fields header it builds is always a valid
HTTP header value, bounded in size."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server import protocol
from server.protocol import ApiError

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

# every JSON value, nested a little, with numbers at the edges floats and ints reach
scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1e-46, 1e-38, 1e308, -0.0, 2**63])
           | st.text(max_size=40))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)
FIELDS = ("model", "prompt", "messages", "max_tokens", "min_tokens", "temperature", "top_p", "top_k", "seed",
          "stream", "stream_options", "ignore_eos", "stop", "logprobs", "n", "acceptance_length", "user")
requests = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=20), json_values, max_size=8)


def _parse(parser, body: bytes) -> None:
    try:
        parser(body)
    except ApiError as exc:
        assert 400 <= exc.status < 500, (exc.status, exc.message)
        assert orjson.loads(exc.body())["error"]["message"]


@pytest.mark.parametrize("parser", [protocol.parse_completion_request, protocol.parse_chat_request])
@FUZZ
@given(body=st.binary(max_size=200))
def test_any_bytes_parse_or_are_a_4xx(parser, body):
    _parse(parser, body)


@pytest.mark.parametrize("parser", [protocol.parse_completion_request, protocol.parse_chat_request])
@FUZZ
@given(request=requests)
def test_any_request_shaped_json_parses_or_is_a_4xx(parser, request):
    _parse(parser, json.dumps(request).encode())  # the stdlib's: integers beyond 64 bits too


@FUZZ
@given(names=st.lists(st.text(max_size=300), max_size=40))
def test_the_ignored_fields_header_is_always_a_bounded_header_value(names):
    value = protocol.ignored_fields_header(tuple(names))
    assert all(0x20 <= ord(c) < 0x7F for c in value)  # visible ASCII and spaces: no CR, LF or NUL
    assert len(value) <= 16 * 90 + 40
