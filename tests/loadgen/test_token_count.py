"""The compiled counter of SSE content events (loadgen/transport/_readpath.c's
count_content_tokens) against orjson: piece by piece, it counts a content chunk exactly as the
Python path does, or leaves the piece to orjson (0); it never counts anything orjson would not,
nor a different count, and the pieces it leaves cost a batch no more than their own parse."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys

import orjson
import pytest

from loadgen.transport import connection, readpath
from loadgen.transport.base import Exchange
from loadgen.transport.http import _SseStream
from tests.loadgen.conftest import REQUIRE_READPATH, HandTransport, require_compiled_reads


@pytest.fixture
def count():
    require_compiled_reads()
    counter = readpath.content_token_counter()
    assert counter is not None
    return counter


def _piece(obj: object, head: bytes = b"data: ", tail: bytes = b"\n\n") -> bytes:
    return head + orjson.dumps(obj) + tail


def _completion(ids: list[int], text: str = "x", **extra: object) -> dict:
    """Our server's completions chunk (server/protocol/responses.py's ResponseHeader.chunk)."""
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None, "token_ids": ids}
    return {"id": "cmpl-7", "object": "text_completion", "created": 1764633600, "model": "m",
            "choices": [choice], **extra}


def _chat(ids: list[int], text: str = "x", first: bool = False) -> dict:
    delta = {"role": "assistant", "content": text} if first else {"content": text}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, "token_ids": ids}
    return {"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1764633600, "model": "m",
            "choices": [choice], "usage": None}


def _vllm_completion_logprobs(ids: list[int]) -> dict:
    """vLLM's completions chunk with logprobs, token ids first in its choice."""
    logprobs = {"text_offset": [0, 4], "token_logprobs": [-0.5, -1.25e-05], "tokens": ["the", "cat"],
                "top_logprobs": [{"the": -0.5, "a": -1.2}, {"cat": -1.25e-05, "dog": -11.5}]}
    choice = {"token_ids": ids, "index": 0, "text": "the cat", "logprobs": logprobs, "finish_reason": None,
              "stop_reason": None, "prompt_logprobs": None}
    return {"id": "cmpl-abc", "created": 1764633600, "model": "deepseek", "choices": [choice], "usage": None,
            "object": "text_completion"}


def _vllm_chat_logprobs(ids: list[int]) -> dict:
    """vLLM's chat chunk with logprobs (nested objects and lists), token ids last in its choice."""
    top = [{"token": "x", "logprob": -2.3e-05, "bytes": [120]}, {"token": "y", "logprob": -10.0, "bytes": [121]}]
    content = [{"token": "x", "logprob": -0.0001, "bytes": [120], "top_logprobs": top}]
    choice = {"index": 0, "delta": {"content": "x"}, "logprobs": {"content": content}, "finish_reason": None,
              "stop_reason": None, "token_ids": ids}
    return {"id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1764633600, "model": "m",
            "choices": [choice, {"index": 1, "delta": {}, "flags": [True, False, None, 0, -0, 1.5E+3]}]}


# Every one a plain content chunk: the counter takes each, alone and in batches.
PLAIN = [
    _piece(_completion([7])),
    _piece(_completion([1, 2, 3, 4])),  # speculative decoding: several tokens in one chunk
    _piece(_completion([0, 129279, 2 ** 40], usage=None)),
    _piece(_completion([5], text="")),
    _piece(_completion([5], text='it is ok: {not json} [1,2] , : ')),
    _piece(_chat([9], first=True)),
    _piece(_chat([10, 11])),
    _piece(_vllm_completion_logprobs([279, 8415])),
    _piece(_vllm_chat_logprobs([120])),
    _piece({"choices": [{"token_ids": [1]}]}),
    _piece({"choices": [{"token_ids": [-1, 0, 3]}]}, head=b"data:"),
    _piece({"choices": [{"token_ids": [1, 2]}], "x": {"y": [[], {}, [[]]]}}, tail=b" \t\r\n\n"),
    b'data: \t{ "choices" : [ { "token_ids" : [ 1 , 2 ] } ] }  \n\n',
    b'data: {"choices":[{"token_ids":[1],"text":"\x7f"}],"n":-0.5e-3,"m":1E2,"k":0}\n\n',
    # detokenised text: JSON's escapes and UTF-8 characters of 2, 3 and 4 bytes
    _piece(_completion([5], text='say "hi"')),
    _piece(_completion([5], text="line\nbreak")),
    _piece(_completion([5], text="caf\u00e9")),
    _piece(_completion([5], text="\U0001f600")),
    _piece(_chat([5], text="\u65e5\u672c")),
    _piece(_completion([5], text='def f(x):\n\tif x == "a\\b":\r\n\t\treturn \'\u00b5s \u2264 1 \U0001f680\'\n')),
    _piece(_completion([5], text="\x00\x01\x08\x0c\x1f\x7f\ud7ff\ue000\uffff\U00010000\U0010ffff")),
    _piece(_chat([6, 7], text="\n")),
    _piece(_chat([6], text="\u00e9")),
    _piece({"choices": [{"token_ids": [1], "text": "\u00e9\u65e5\U0001f600", "k": ["\\", "\n", ""]}]}),
    b'data: {"choices":[{"token_ids":[1],"text":"\\"\\\\\\/\\b\\f\\n\\r\\t"}]}\n\n',  # every escape kind
    b'data: {"choices":[{"token_ids":[1],"text":'
    b'"\\u0000\\u00E9\\u00e9\\uFFFF\\uD83D\\uDE00\\ud83d\\ude00\\uDBFF\\uDFFF"}]}\n\n',
    b'data: {"choices":[{"token_ids":[1],"text":"\\n","t":"\\u0041","u":"\\\\","v":"\\"x\\""}]}\n\n',
    b'data: {"choices":[{"token_ids":[1],'
    b'"text":"\xc3\xa9","t":"\xe6\x97\xa5","u":"\xf0\x9f\x98\x80","v":"\xc2\x80\xdf\xbf"}]}\n\n',
    b'data: {"choices":[{"token_ids":[1],'
    b'"text":"\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80\xf0\x90\x80\x80\xf4\x8f\xbf\xbf"}]}\n\n',
]

# Valid JSON it must leave to orjson (0): escaped or non-ASCII keys, other shapes.
REFUSED = [
    b'data: {"ch\\u006fices":[{"token_ids":[1]}]}\n\n',  # an escaped key may spell a name that counts
    b'data: {"choices":[{"token\\u005fids":[1]}]}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"\\u0065rror":{"message":"boom"}}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"\\n":1}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"caf\xc3\xa9":1}\n\n',
    b'data: {"choices":[{"token_ids":[1],"\xe6\x97\xa5":"x"}]}\n\n',
    _piece(_completion([5], usage={"completion_tokens": 1})),
    _piece(_completion([5], usage=0)),
    _piece(_completion([5], error={"message": "boom"})),
    _piece(_completion([])),
    _piece({"choices": [{"token_ids": [1.0]}]}),
    _piece({"choices": [{"token_ids": ["1"]}]}),
    _piece({"choices": [{"token_ids": [[1]]}]}),
    _piece({"choices": [{"token_ids": None}]}),
    _piece({"choices": [{"token_ids": "abc"}]}),
    _piece({"choices": [{"text": "x"}]}),
    _piece({"choices": [{"delta": {"role": "assistant"}}]}),
    _piece({"choices": []}),
    _piece({"choices": {"token_ids": [1]}}),
    _piece({"choices": [[{"token_ids": [1]}]]}),
    _piece({"choices": [{"text": "x"}, {"token_ids": [1]}]}),
    _piece({"token_ids": [1]}),
    _piece([{"choices": [{"token_ids": [1]}]}]),
    b'data: {"choices":[{"token_ids":[1]}],"\\u0075sage":{"completion_tokens":2}}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"usage":null,"usage":{"completion_tokens":2}}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"choices":[{"token_ids":[1,2]}]}\n\n',  # orjson keeps the last
    b'data: {"choices":[{"token_ids":[1],"token_ids":[1,2]}]}\n\n',
    b'data: {"choices":[{"token_ids":[1]}]}{"choices":[{"token_ids":[2]}]}\n\n',  # two values: malformed
    b'data: {"choices":[{"token_ids":[1]}]},{"choices":[{"token_ids":[2]}]}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":1e400}\n\n',  # orjson: infinity, an error
    b'data: {"choices":[{"token_ids":[1]}],"x":' + b"9" * 400 + b"}\n\n",
    b'data: {"choices":[{"token_ids":[1]}],"x":' + b"[" * 100 + b"]" * 100 + b"}\n\n",
    b'data: {"choices":[{"token_ids":[1]}]}\r\n\r\n',  # a CRLF blank line: two lines in the piece
    b'data: {"choices":[{"token_ids":[1]}]}\n',
    b': keep-alive\n\n',
    b"data: [DONE]\n\n",
    b'data: {"choices":[{"token_ids":[1]}]}\n\ndata: {"choices":[{"token_ids":[2]}]}\n\n',
    b' data: {"choices":[{"token_ids":[1]}]}\n\n',
]

# Not JSON at all: orjson fails each, so must the counter.
MALFORMED = [
    b'data: {"choices":[{"token_ids":[1,]}]}\n\n',
    b'data: {"choices":[{"token_ids":[1]},]}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],}\n\n',
    b'data: {"choices":[{"token_ids":[01]}]}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":01}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":1.}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":.5}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":-}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":1e}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":+1}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":tru}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":nul}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":True}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"a\tb"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"abc}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],x:1}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":}\n\n',
    b'data: {"choices":[{"token_ids":[1]}] "x":1}\n\n',
    b'data: {"choices":[{"token_ids":[1]}]\n\n',
    b'data: {"choices":[{"token_ids":[1 2]}]}\n\n',
    b'data: {"choices":[{"token_ids":[1]}]}}\n\n',
    b"data: {'choices':[{'token_ids':[1]}]}\n\n",
    b'data: \x0c{"choices":[{"token_ids":[1]}]}\n\n',
    b"data: \n\n",
    # escapes JSON does not allow
    b'data: {"choices":[{"token_ids":[1]}],"x":"\\x41"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\\U0041"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\\a"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\\\'"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\\u12"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\\u12G4"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\\u 123"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"ab\\"}\n\n',  # a trailing backslash escapes the quote
    b'data: {"choices":[{"token_ids":[1]}],"x":"ab\\\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\\\xc3\xa9"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\\ud800"}\n\n',  # lone surrogates
    b'data: {"choices":[{"token_ids":[1]}],"x":"\\udc00\\ud800"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\\ud800\\u0041"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\\ud800\\ud800"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\\ud800\\n"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\\udbff"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\\udc00"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"a\\uDFFFb"}\n\n',
    # bytes that are not UTF-8
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xc0\x80"}\n\n',  # overlong
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xc1\xbf"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xe0\x80\x80"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xe0\x9f\xbf"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xf0\x80\x80\x80"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xf0\x8f\xbf\xbf"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xed\xa0\x80"}\n\n',  # a surrogate
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xed\xbf\xbf"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xf4\x90\x80\x80"}\n\n',  # past U+10FFFF
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xf5\x80\x80\x80"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xff"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\x80"}\n\n',  # a continuation byte alone
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xc3"}\n\n',  # truncated
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xe6\x97"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xe6\x97a"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xf0\x9f\xc3\xa9"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xf0\x9f\x98"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xf0\x9f\x98a"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xe6\xc3\xa9"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xc3\xa9\xa9"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"\xf0\x9f\x98\x80\x80"}\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"a\xc3\n\n',
    b'data: {"choices":[{"token_ids":[1]}],"x":"a\xf0\x9f\n\n',
]


def _reference(piece: bytes) -> int | None:
    """The Python path's count of one piece taken as a content chunk, None for anything else
    (raises orjson.JSONDecodeError for malformed JSON)."""
    event = orjson.loads(piece[5:])
    try:
        ids = event["choices"][0]["token_ids"]
    except (LookupError, TypeError):
        return None
    if not isinstance(ids, list) or not ids or event.get("usage") or "error" in event:
        return None
    return len(ids)


def _check(count, pieces: list[bytes]) -> list[int]:
    """The counter's answer for a batch, checked against orjson piece by piece: 0 (left to
    orjson), or orjson's count."""
    counts = count(pieces)
    assert type(counts) is list and len(counts) == len(pieces), pieces
    for piece, n in zip(pieces, counts):
        assert type(n) is int and n >= 0, n
        if n == 0:
            continue
        assert piece.startswith(b"data:") and piece.endswith(b"\n\n") and piece.count(b"\n") == 2, piece
        try:
            expected = _reference(piece)
        except orjson.JSONDecodeError:
            raise AssertionError(f"counted malformed JSON: {piece!r}") from None
        assert n == expected, piece
    return counts


def test_the_counter_counts_every_plain_content_event(count):
    for piece in PLAIN:
        assert _check(count, [piece]) != [0], piece
    counts = _check(count, PLAIN)
    assert counts == [_reference(piece) for piece in PLAIN] and count([]) == []


@pytest.mark.parametrize("piece", REFUSED + MALFORMED)
def test_the_counter_leaves_every_other_event_to_orjson(count, piece):
    if piece in MALFORMED:  # the list holds what orjson fails
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(piece[5:])
    assert count([piece]) == [0]
    # one such piece is left to orjson alone: the pieces around it are still counted
    assert count([PLAIN[0], piece, PLAIN[1], piece]) == [_reference(PLAIN[0]), 0, _reference(PLAIN[1]), 0]


def _with_text(text: bytes) -> bytes:
    return b'data: {"choices":[{"token_ids":[1],"text":"' + text + b'"}]}\n\n'


@pytest.mark.parametrize("stop", [b'"', b"\\x", b"\\u12G", b"\\ud800", b"\\udc00", b"\x00", b"\x1f", b"\x80", b"\xff",
                                  b"\xc3", b"\xe6\x97", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"])
def test_a_string_with_a_quote_control_byte_or_bad_escape_or_utf8_anywhere_is_refused(count, stop):
    """Long strings are scanned eight bytes at a time: the bytes are caught at every offset."""
    for at in range(40):
        piece = _with_text(b"a" * at + stop + b"b" * (39 - at))
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(piece[5:])
        assert count([piece]) == [0], at
    assert count([_with_text(b"\x7f ~" * 20)]) == [1]


@pytest.mark.parametrize("text", [b"\\n", b"\\\\", b'\\"', b"\\/", b"\\t", b"\\u00e9", b"\\uD83D\\uDE00", b"\xc3\xa9",
                                  b"\xe6\x97\xa5", b"\xf0\x9f\x98\x80", b'\\n\xc3\xa9\\"\xf0\x9f\x98\x80\\t'])
def test_escapes_and_utf8_anywhere_in_a_long_string_are_counted(count, text):
    """At every offset of the eight-byte scan, at the string's start and at its end."""
    for at in range(24):
        for piece in (_with_text(b"a" * at + text + b"b" * (23 - at)), _with_text(b"a" * at + text),
                      _with_text(text + b"b" * at), _with_text(text * (at + 1))):
            assert _check(count, [piece]) == [1], piece


def test_the_counter_refuses_what_is_not_a_list_of_bytes(count):
    with pytest.raises(TypeError):
        count((PLAIN[0],))
    with pytest.raises(TypeError):
        count([PLAIN[0].decode()])


def _mutations(piece: bytes, rng: random.Random):
    """Every byte flipped (to a structural character and a random one), deleted and duplicated;
    every truncation of the event's JSON; and random multi-byte edits."""
    structural = b'{}[]",:-.0123456789eE+ tfnrulbDd\\/\x00\x80\x8f\x90\x9f\xa0\xbf\xc0\xc3\xe0\xed\xf0\xf4\xff'
    for at in range(len(piece)):
        for byte in (structural[rng.randrange(len(structural))], rng.randrange(256)):
            yield piece[:at] + bytes([byte]) + piece[at + 1:]
        yield piece[:at] + piece[at + 1:]
        yield piece[:at + 1] + piece[at:]
    for end in range(6, len(piece) - 2):
        yield piece[:end] + b"\n\n"
    for _ in range(200):
        edited = bytearray(piece)
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(len(edited))
            edited[at:at + rng.randrange(0, 3)] = bytes(rng.choice(structural) for _ in range(rng.randrange(0, 3)))
        yield bytes(edited)


@pytest.mark.parametrize("base", range(len(PLAIN)))
def test_mutated_events_are_refused_or_counted_as_orjson_counts(count, base):
    """A fuzz: every mutation of a plain event is either left to orjson or counted exactly as
    orjson's parse counts it, alone and after a plain event."""
    rng = random.Random(base)
    counted = 0
    for mutated in _mutations(PLAIN[base], rng):
        counted += _check(count, [mutated]) != [0]
        _check(count, [PLAIN[0], mutated, PLAIN[1]])
    assert counted  # some mutations (a digit for a digit, a letter in a string) stay plain events


def _usage_event(completion_tokens: int = 4) -> dict:
    return {"id": "c", "object": "text_completion", "choices": [],
            "usage": {"prompt_tokens": 100, "completion_tokens": completion_tokens, "total_tokens": 104}}


DONE = b"data: [DONE]\n\n"
USAGE = _piece(_usage_event())
# Events of real streams that the counter leaves to the line rules, each in its own piece.
ROLE = _piece({"id": "chatcmpl-7", "object": "chat.completion.chunk", "model": "m",  # vLLM's first chat chunk
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}]})
FINISH = _piece({"choices": [{"index": 0, "text": "", "finish_reason": "length", "token_ids": []}]})  # no token
EMPTY_IDS_TEXT = _piece(_completion([], text="x"))  # an empty-ids chunk whose text is a token
USAGE_ON_CONTENT = _piece(_completion([5, 6], usage=_usage_event()["usage"]))
TEXT_ONLY = _piece({"choices": [{"index": 0, "text": "x", "finish_reason": None}]})
ERROR = _piece({"error": {"message": "boom", "code": 500}})
LEFT = [ROLE, FINISH, EMPTY_IDS_TEXT, USAGE_ON_CONTENT, TEXT_ONLY, USAGE]

# Whole responses as the reader may batch them: vLLM's (usage and [DONE] apart), ours and the
# test server's (together), chat, events split over and packed into pieces, an error mid-batch.
STREAMS = [
    [*PLAIN[:6], USAGE, DONE],
    [*PLAIN[:6], USAGE + DONE],
    [ROLE, *PLAIN[5:7], FINISH, USAGE, DONE],
    [PLAIN[0], USAGE, PLAIN[1], DONE, PLAIN[2]],
    [EMPTY_IDS_TEXT, PLAIN[3], USAGE_ON_CONTENT, PLAIN[4], TEXT_ONLY, TEXT_ONLY, PLAIN[5]],
    [PLAIN[0] + PLAIN[1], PLAIN[2], PLAIN[3][:-1], b"\n", PLAIN[4][:20], PLAIN[4][20:], PLAIN[5]],
    [PLAIN[0], ERROR, PLAIN[1], USAGE, DONE],
    [PLAIN[0], PLAIN[1][:-1] + b"}\n\n", PLAIN[2]],  # malformed mid-batch: the request fails there
    [DONE],
    [USAGE],
]


def _take(batches: list[list[bytes]], compiled: bool, monkeypatch, chat: bool = False) -> tuple:
    """What an _SseStream records for its batches, with the counter or the Python path alone."""
    with monkeypatch.context() as patch:
        if not compiled:
            patch.setattr(readpath, "_readpath", None)
        stream = _SseStream(Exchange(), chat=chat)
        stamp = 0
        for pieces in batches:
            stream.take(pieces, [1000 * (stamp + i + 1) for i in range(len(pieces))])
            stamp += len(pieces)
    ex = stream.ex
    return (ex.chunk_ns, ex.chunk_tokens, ex.usage_prompt_tokens, ex.usage_completion_tokens,
            stream.done, stream.error, stream.detail)


@pytest.mark.parametrize("chat", [False, True])
def test_a_batch_records_the_same_with_and_without_the_counter(count, monkeypatch, chat):
    rng = random.Random(7)
    others = REFUSED + MALFORMED + LEFT + [ERROR, DONE]
    batches = [PLAIN, PLAIN + [DONE], *STREAMS]
    batches += [[*PLAIN[:3], other, *PLAIN[3:5]] for other in others]
    batches += [[other, *PLAIN[:2], other] for other in others]
    batches += [[rng.choice(PLAIN), mutated, rng.choice(PLAIN)] for mutated in _mutations(PLAIN[0], rng)]
    for batch in batches:
        assert _take([batch], True, monkeypatch, chat) == _take([batch], False, monkeypatch, chat), batch
    stream = [piece for batch in STREAMS[:3] for piece in batch]  # one response cut into batches anywhere
    for cut in range(1, len(stream)):
        batches = [stream[:cut], stream[cut:]]
        assert _take(batches, True, monkeypatch, chat) == _take(batches, False, monkeypatch, chat), cut


def test_the_python_path_stamps_a_batch_as_piece_by_piece_at_every_cut(monkeypatch):
    """Without the compiled reader, a batch cut at any of its newlines (pieces of two events,
    events cut after their first newline) records what the same pieces taken one at a time do:
    each event stamped by the piece that ends it. A piece of two events and an event cut in two
    once balanced out in the batch's separator count and gave an event the next one's stamp."""
    text = b"".join(PLAIN[:4])
    newlines = [i + 1 for i, byte in enumerate(text[:-1]) if byte == ord("\n")]
    for n in range(len(newlines) + 1):
        for cuts in itertools.combinations(newlines, n):
            bounds = [0, *cuts, len(text)]
            pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
            one_by_one = _take([[piece] for piece in pieces], False, monkeypatch)
            assert _take([pieces], False, monkeypatch) == one_by_one, cuts


def _parsed_by_orjson(pieces: list[bytes], monkeypatch) -> tuple[list[bytes], list[int]]:
    """What orjson parses of one batch, and the tokens recorded."""
    from loadgen.transport import http

    parsed: list[bytes] = []
    loads = http.orjson.loads

    def spy(data: bytes) -> object:
        parsed.append(bytes(data))
        return loads(data)

    monkeypatch.setattr(http.orjson, "loads", spy)
    stream = _SseStream(Exchange(), chat=False)
    stream.take(pieces, list(range(len(pieces))))
    monkeypatch.undo()
    assert stream.error is None
    return parsed, stream.ex.chunk_tokens


def test_a_plain_batch_builds_no_objects(count, monkeypatch):
    """The usual batch is the counter's alone: orjson parses nothing of it."""
    parsed, tokens = _parsed_by_orjson(PLAIN, monkeypatch)
    assert parsed == [] and tokens == [_reference(piece) for piece in PLAIN]


def test_only_the_pieces_the_counter_leaves_are_parsed(count, monkeypatch):
    """A usage event, a chat role chunk, an empty-ids chunk or [DONE] in a batch costs its own
    parse, not the batch's: orjson sees exactly those events, once each, in order."""
    batch = [ROLE, *PLAIN[:3], FINISH, PLAIN[3], EMPTY_IDS_TEXT, *PLAIN[4:6], USAGE_ON_CONTENT, USAGE, DONE]
    parsed, tokens = _parsed_by_orjson(batch, monkeypatch)
    assert parsed == [piece[5:-2] for piece in (ROLE, FINISH, EMPTY_IDS_TEXT, USAGE_ON_CONTENT, USAGE)]
    plain = [_reference(piece) for piece in PLAIN]
    assert tokens == [*plain[:3], plain[3], 1, *plain[4:6], 2]


def _read_through_the_reader(pieces: list[bytes], reads: list[int], count_events: bool, chat: bool):
    """`pieces` as one chunked response (a chunk each) read by a compiled reader in reads of the
    given sizes: the batches its sink got, and what an _SseStream took of them."""
    import asyncio
    import socket

    body = b"".join(b"%x\r\n" % len(piece) + piece + b"\r\n" for piece in pieces) + b"0\r\n\r\n"
    response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body
    loop = asyncio.new_event_loop()
    conn = connection.Connection()
    conn.connection_made(HandTransport(conn))
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    conn.reader = readpath._readpath.Reader(ours.fileno(), conn, conn.connection_lost)
    stream = _SseStream(Exchange(), chat=chat)
    batches: list = []

    def sink(pieces, stamps, counts) -> None:
        batches.append((list(pieces), list(stamps), counts))
        stream.take(pieces, stamps, counts)

    done = loop.create_future()
    conn.start(b"", sink, done, None, count_events)
    at = 0
    for size in reads + [len(response)]:
        if at < len(response) and not conn.closed:
            theirs.sendall(response[at:at + size])
            at += size
            conn.reader.readable()
    ours.close()
    theirs.close()
    loop.close()
    assert done.done()
    return batches, stream


@pytest.mark.parametrize("chat", [False, True])
def test_the_reader_counts_as_it_reads_what_the_batch_counter_would(count, chat):
    """With count_events the compiled reader counts each piece as it reads it: a counted piece
    comes as None with the batch counter's count, every other piece as its bytes with 0, and the
    stream records the same as from the same pieces and stamps counted at the batch, every split
    of the reads."""
    rng = random.Random(11)
    responses = STREAMS + [PLAIN + [USAGE + DONE], [ROLE, *PLAIN, USAGE, DONE], [PLAIN[0], ERROR, PLAIN[1], DONE]]
    responses += [[*PLAIN[:2], mutated, PLAIN[2], DONE] for mutated in itertools.islice(_mutations(PLAIN[0], rng), 40)]
    responses.append([*(PLAIN * (connection.BATCH_PIECES // len(PLAIN) + 2)), USAGE, DONE])  # a batch goes out mid-body
    for pieces in responses:
        size = len(b"".join(pieces)) + 200
        for reads in ([size], [1] * size, *([k, size] for k in range(1, size, max(1, size // 25)))):
            counted, by_reader = _read_through_the_reader(pieces, reads, True, chat)
            whole, _ = _read_through_the_reader(pieces, reads, False, chat)
            got = [piece for batch, _, _ in whole for piece in batch]
            assert [counts is None for _, _, counts in whole] == [True] * len(whole)
            assert [piece for batch, _, _ in counted for piece in batch] == [
                None if tokens else piece for piece, tokens in zip(got, count(got))]
            assert [n for _, _, counts in counted for n in counts] == count(got)
            stamps = [stamp for _, batch_stamps, _ in counted for stamp in batch_stamps]
            by_batch = _SseStream(Exchange(), chat=chat)
            by_batch.take(got, stamps)  # the same pieces, counted at the batch
            assert (by_reader.ex, by_reader.done, by_reader.error) == (by_batch.ex, by_batch.done, by_batch.error)


# Run in a fresh interpreter: the build is vetted when readpath.py is imported. The module's
# READ_PATH_VERSION is set (or removed) first, as a build of an older source would have it.
_STALE_BUILD = """
import logging, sys
import pytest
from loadgen.transport import _readpath
if sys.argv[1] == "missing":
    del _readpath.READ_PATH_VERSION
else:
    _readpath.READ_PATH_VERSION = int(sys.argv[1])
from loadgen.transport import http, readpath, wire
from loadgen.transport.base import Exchange
from tests.loadgen.conftest import require_compiled_reads
logging.basicConfig(level=logging.WARNING)
assert readpath._readpath is None and readpath.content_token_counter() is None
assert not readpath.compiled_reads_available()
client = wire.HttpClient("http://127.0.0.1:9", {}, 1)
wire.HttpClient("http://127.0.0.1:9", {}, 1)
assert client.read_path == "python", client.read_path
stream = http._SseStream(Exchange(), chat=False)
stream.take([b'data: {"choices":[{"token_ids":[1,2],"text":"\\u00e9"}]}\\n\\n'], [5])
assert stream.ex.chunk_tokens == [2], stream.ex.chunk_tokens  # counted by orjson
try:
    require_compiled_reads()
except pytest.fail.Exception as failed:
    print("FAILED:", failed)
except pytest.skip.Exception:
    print("SKIPPED")
"""


@pytest.mark.parametrize("version", ["missing", "2", "3", "0", "999"])
def test_a_build_of_another_source_counts_as_not_built(count, version):
    """A stale build: the Python paths read and count, one warning says to rebuild, and the tests
    of the compiled path fail where .ci/run requires it (skip elsewhere)."""
    assert readpath._readpath.READ_PATH_VERSION == readpath.READ_PATH_VERSION  # this build is current
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for required, outcome in (("1", "FAILED:"), ("0", "SKIPPED")):
        env = {**os.environ, "PYTHONPATH": root, REQUIRE_READPATH: required}
        run = subprocess.run([sys.executable, "-c", _STALE_BUILD, version], capture_output=True, text=True,
                             env=env, cwd=root, timeout=120)
        assert run.returncode == 0, run.stderr
        assert run.stdout.startswith(outcome), run.stdout
        assert run.stderr.count("pip install -e .") == 1, run.stderr  # once per process
