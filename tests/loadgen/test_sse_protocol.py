"""Malformed SSE events: valid JSON of the wrong shape fails the request as a protocol error."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import orjson
import pytest

from loadgen.transport.base import WireRequest
from loadgen.transport.http import HttpTransport

MODELS = orjson.dumps({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "test"}]})


def _event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _token(i: int) -> bytes:
    return _event({"choices": [{"index": 0, "text": "x", "token_ids": [i], "finish_reason": None}]})


def _stream(bad: bytes, n_tokens: int) -> bytes:
    """`bad` shares its chunk (one socket write) with the first token, then a normal stream."""
    events = [bad + _token(0)] + [_token(i) for i in range(1, n_tokens)]
    usage = {"prompt_tokens": 3, "completion_tokens": n_tokens, "total_tokens": 3 + n_tokens}
    events.append(_event({"choices": [], "usage": usage}) + b"data: [DONE]\n\n")
    return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


class BadEventServer:
    """A raw HTTP/1.1 server on 127.0.0.1, in its own thread: lists one model, streams every
    completion with `bad` just before the first token chunk, and answers 404 to anything else."""

    def __init__(self, bad: bytes) -> None:
        self.bad = bad
        self.requests = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "test server did not start"
        self.url = f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length)
                if head.startswith(b"GET /v1/models"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(MODELS), MODELS))
                elif not head.startswith(b"POST /v1/completions"):  # e.g. GET /metrics
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                else:
                    self.requests += 1
                    n_tokens = orjson.loads(body)["max_tokens"]
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n" + _stream(self.bad, n_tokens))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def bad_event_server():
    servers: list[BadEventServer] = []

    def start(bad: bytes) -> BadEventServer:
        servers.append(BadEventServer(bad))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


WRONG_SHAPES = [
    b"data: [1]\n\n",
    b"data: 7\n\n",
    b'data: {"choices": ["x"]}\n\n',
    b'data: {"choices": {"text": "x"}}\n\n',
    b'data: {"choices": [{"token_ids": 5}]}\n\n',
    b'data: {"choices": [], "usage": 5}\n\n',
    b'data: {"choices": [], "usage": {"prompt_tokens_details": [1]}}\n\n',
]


@pytest.mark.parametrize("bad", WRONG_SHAPES, ids=[b[6:-2].decode() for b in WRONG_SHAPES])
def test_an_event_of_the_wrong_shape_is_a_protocol_error(bad_event_server, bad, read_path):
    server = bad_event_server(bad)

    async def main():
        transport = HttpTransport(server.url)
        await transport.open(2)
        try:
            await transport.server_info()
            request = WireRequest(request_id="r1", prompt=np.arange(3, dtype=np.int32), max_tokens=4)
            return await transport.send(request)
        finally:
            await transport.close()

    ex = asyncio.run(main())
    assert ex.error == "protocol"
    assert "not an OpenAI stream chunk" in ex.error_detail and bad[6:-2].decode() in ex.error_detail


def test_a_list_event_fails_its_request_and_is_counted(bad_event_server, sessions, replay):
    server = bad_event_server(b"data: [1]\n\n")
    folder = sessions({"n_requests": 4, "think": 0.0, "n_out": 3})
    code, doc, records = replay(server.url, "--traces", str(folder), "--duration", "0.5")
    level = doc["levels"][0]
    counts = level["counts"]
    assert records and len(records) == server.requests
    assert {r["error"] for r in records} == {"protocol"}
    assert counts["requests_ok"] == 0 and counts["warmup_requests_ok"] == 0
    assert counts["errors"].get("protocol", 0) + counts["warmup_errors"].get("protocol", 0) == len(records)
    assert level["failed"] and code == 1  # every request failed: above any error-rate limit


@pytest.mark.parametrize("line", [b"data: [DONE]", b"data:[DONE]", b"data: [DONE]\r", b"data: [DONE] \r"])
def test_done_ends_the_stream_with_or_without_a_carriage_return(line):
    """Servers that end SSE lines with CRLF leave a `\\r` on each line (the body is split on `\\n`)."""
    from loadgen.transport.base import Exchange
    from loadgen.transport.http import _SseStream

    stream = _SseStream(Exchange(), chat=False)
    stream.line(line, 0)
    assert stream.done and stream.error is None


def _by_lines(pieces: list[bytes], stamps: list[int]):
    from loadgen.transport.base import Exchange
    from loadgen.transport.http import _SseStream

    stream = _SseStream(Exchange(), chat=False)
    for piece, now in zip(pieces, stamps):
        for line in piece.split(b"\n"):
            if len(line) > 1:
                stream.line(line, now)
    return stream


@pytest.mark.parametrize("batch", [
    [b'data: {"choices":[{"text":"a","token_ids":[1]}]}\n\n', b'data:{"choices":[{"token_ids":[2,3]}]}\n\n'],
    [b'data: {"choices":[{"text":"a","token_ids":[1]}]}\n\n', b'data: {"choices":[],"usage":{"prompt_tokens":4,'
     b'"completion_tokens":3}}\n\ndata: [DONE]\n\n'],
    [b'data: {"choices":[{"text":"a","token_ids":[]}]}\n\n', b'data: {"choices":[{"text":"b"}]}\n\n'],
    [b'data: {"choices":[{"token_ids":[1]}],"usage":{"completion_tokens":1}}\n\n'],
    [b'data: {"choices":[{"token_ids":[1]}]}\r\n\r\n', b': keep-alive\n\n', b'data: {"choi'],
    [b'data: {"choices":[{"token_ids":[1]}]}\n\n', b'data: {"error":{"message":"boom"}}\n\n'],
    [b'data: {"choices":[{"token_ids":[1]}]}\n\n', b'data: [1]\n\n', b'data: {"choices":[{"token_ids":[2]}]}\n\n'],
    [b'data: {"choices":[{"token_ids":[1]}]}\n\n', b'data: {"x": "data: \\n"}\n\n'],
    [b'data: {"choices":[{"token_ids":[1]}]}\n\n', b'data: {"choices":[],"usage":{"completion_tokens":2}}\n\n',
     b'data: [DONE]\n\n'],
    [b'data: {"choices":[{"token_ids":[1]}]}\n\n', b'data: {"choices":[{"token_ids":[2]}],"usage":{"x":1}}\n\n',
     b'data: {"choices":[{"token_ids":[3]}]}\n\n'],
    [b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n', b'data: {"choices":[{"token_ids":[4,5]}]}\n\n',
     b'data: {"choices":[{"text":"c"}]}\n\n', b'data: {"choices":[{"token_ids":[6]}]}\n\n'],
    [b'data: {"error":{"message":"boom"}}\n\n', b'data: {"choices":[{"token_ids":[1]}]}\n\n'],
    [b'data: {"choices":[{"token_ids":[1,2]}]}\n\n', b'data: {"choices":[{"text":"a","token_ids":null}]}\n\n',
     b'data: {"choices":[{"token_ids":[3]}]}\n\n'],
    [b'data: {"choices":[{"token_ids":[1]}]}\n\n', b'data: {"choices":[]}\n\n',
     b'data: {"choices":[{"token_ids":[2]}]}\n\n'],
    [b'data: {"choices":[{"token_ids":[1]}]}\n\n', b'data: {"choices":[{"token_ids":[2,3,4]}]}\n\n',
     b'data: {"choices":[{"token_ids":[5]}]}\n\n'],
    [b'data: {"choices":[{"token_ids":[1]}]}\n\n',  # a usage key spelled with an escape is still usage
     b'data: {"choices":[{"token_ids":[2]}],"\\u0075sage":{"completion_tokens":2}}\n\n'],
    [b'data: {"choices":[{"token_ids":[1]}]}\n', b'\ndata: {"choices":[{"token_ids":[2]}]}\n\n'],
    [b'data: {"choices":[{"token_ids":[1]}]}\n\n',  # two JSON values in one event: malformed
     b'data: {"choices":[{"token_ids":[2]}]},{"choices":[{"token_ids":[3]}]}\n\n'],
])
def test_a_batch_of_pieces_reads_as_its_lines_one_by_one(batch):
    """The batched SSE path (one JSON parse per batch when every piece is one content chunk) and
    the line-by-line rules agree on chunk times, token counts, usage, [DONE] and errors."""
    from loadgen.transport.base import Exchange
    from loadgen.transport.http import _SseStream

    stamps = [1000 * (i + 1) for i in range(len(batch))]
    batched = _SseStream(Exchange(), chat=False)
    batched.take(batch, stamps)
    single = _by_lines(batch, stamps)
    for name in ("chunk_ns", "chunk_tokens", "usage_prompt_tokens", "usage_completion_tokens"):
        assert getattr(batched.ex, name) == getattr(single.ex, name), name
    assert (batched.done, batched.error, batched.detail) == (single.done, single.error, single.detail)


def test_content_chunks_before_the_usage_event_take_the_batched_path(monkeypatch):
    """A whole short response in one batch, its usage and [DONE] as pieces of their own (as vLLM
    sends them): the content chunks are parsed in one go, only the last two events line by line."""
    from loadgen.transport.base import Exchange
    from loadgen.transport.http import _SseStream

    batch = [b'data: {"choices":[{"token_ids":[%d]}]}\n\n' % i for i in range(20)]
    batch += [b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":20}}\n\n', b"data: [DONE]\n\n"]
    lines = []
    line = _SseStream.line
    monkeypatch.setattr(_SseStream, "line", lambda self, text, now: (lines.append(text), line(self, text, now)))
    stream = _SseStream(Exchange(), chat=False)
    stream.take(batch, list(range(1, len(batch) + 1)))
    assert len(lines) == 2 and stream.done and stream.ex.usage_completion_tokens == 20
    assert stream.ex.chunk_tokens == [1] * 20 and stream.ex.chunk_ns == list(range(1, 21))


def test_a_role_only_first_chunk_leaves_the_rest_to_the_batched_path(monkeypatch):
    """vLLM's chat stream opens with a chunk that carries only the role: that one event goes line
    by line, the content chunks after it are still parsed in one go."""
    from loadgen.transport.base import Exchange
    from loadgen.transport.http import _SseStream

    batch = [b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n']
    batch += [b'data: {"choices":[{"token_ids":[%d]}]}\n\n' % i for i in range(10)]
    lines = []
    line = _SseStream.line
    monkeypatch.setattr(_SseStream, "line", lambda self, text, now: (lines.append(text), line(self, text, now)))
    stream = _SseStream(Exchange(), chat=True)
    stream.take(batch, list(range(1, len(batch) + 1)))
    assert len(lines) == 1
    assert stream.ex.chunk_tokens == [1] * 10 and stream.ex.chunk_ns == list(range(2, 12))
