"""HTTP transport: OpenAI /v1/completions or /v1/chat/completions with streaming SSE.

Runs on wire.HttpClient (asyncio protocols, keep-alive pool sized to the load): each socket
read is timestamped once with perf_counter_ns, and every SSE line it completes carries that
arrival time; the request's coroutine wakes once, at the end of the response.

The SSE events come in batches of reads (connection.BodySink). Where the compiled read path is
built, it validates and counts each piece that is one content chunk with `token_ids` without
building objects -- on a compiled connection as it reads the piece (the request asks for it
with `count_events`), else over the batch (count_content_tokens) -- and leaves every other piece
(usage, [DONE], a chat role chunk, errors, several lines per read, servers without token ids) to
the line rules below, in its place. Without it, the usual batch, one `data:` event per read, is
parsed as one JSON array in one call and its token counts read in one comprehension; any event
of another shape, or any batch that is not one event per read, goes line by line through the
same rules.

Request body (completions): `prompt` = the token ids (exact input length), `max_tokens` =
`min_tokens` = the trace's output length, `ignore_eos`, `stream`, `stream_options.include_usage`,
and `user` naming the session play. Chat: one user message whose text is the token ids written
as space-separated decimal numbers; other tokenizers turn that into roughly one or two tokens
per id, so use completions when the input length must be exact. Each request carries
`X-Request-Id` (vLLM takes it as its request id, so server logs match the per-request records).

Tokens per content chunk: `len(choice["token_ids"])` when the server sends token ids (vLLM's
and our server's extension), else 1.

Speculative decoding: `acceptance_length` goes into the body only when the request carries one
(the replay sets it only for our server); `usage.spec_decode` is read when present, and
`server_counters` scrapes /metrics (for servers that do not report it per request, and for our
server's count of kernel compiles).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, cast

import orjson

from loadgen.defaults import DEFAULTS
from loadgen.telemetry.server_counters import ServerCounters, parse_server_counters
from loadgen.transport.base import (
    ErrorKind,
    Exchange,
    ServerInfo,
    Transport,
    TransportError,
    WireRequest,
)
from loadgen.transport.connection import ResponseError
from loadgen.transport.readpath import content_token_counter
from loadgen.transport.wire import HttpClient

ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


class HttpTransport(Transport):
    def __init__(
        self,
        base_url: str,
        endpoint: str = DEFAULTS.endpoint,
        model: str | None = None,
        api_key: str | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float = DEFAULTS.timeout_s,
    ) -> None:
        if endpoint not in ENDPOINT_PATHS:
            raise ValueError(f"--endpoint: expected one of {', '.join(ENDPOINT_PATHS)}, got {endpoint!r}")
        self.base_url = base_url.rstrip("/")
        self.endpoint = endpoint
        self.model = model
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._path = ENDPOINT_PATHS[endpoint]
        self._client: HttpClient | None = None

    def _opened(self) -> HttpClient:
        assert self._client is not None, "open() first"
        return self._client

    async def open(self, max_connections: int) -> None:
        self._client = HttpClient(self.base_url, self.headers, max_connections)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def server_info(self) -> ServerInfo:
        url = self.base_url + "/v1/models"
        try:
            resp = await self._opened().request("GET", "/v1/models", timeout=self.timeout_s)
        except asyncio.TimeoutError:
            raise TransportError(f"cannot reach the server at {self.base_url}: waited for the model list "
                                 f"(GET {url}) and got no answer within {self.timeout_s:g} s (--timeout)") from None
        except ResponseError as exc:
            raise TransportError(f"cannot reach the server at {self.base_url}: waited for the model list "
                                 f"(GET {url}): {exc}") from None
        if resp.status != 200:
            raise TransportError(f"GET {url} returned HTTP {resp.status}: {resp.body[:200]!r}")
        try:
            models = orjson.loads(resp.body)["data"]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise TransportError(f"GET {url}: not an OpenAI model list: {resp.body[:200]!r}") from exc
        info = parse_server_info(models, self.model, url)
        self.model = info.model
        return info

    async def server_counters(self) -> ServerCounters | None:
        try:
            resp = await self._opened().request("GET", "/metrics", timeout=self.timeout_s)
        except (ResponseError, asyncio.TimeoutError):
            return None
        if resp.status != 200:
            return None
        return parse_server_counters(resp.body.decode("utf-8", "replace"))

    async def metrics_text(self) -> str:
        try:
            resp = await self._opened().request("GET", "/metrics", timeout=self.timeout_s)
        except (ResponseError, asyncio.TimeoutError) as exc:
            raise TransportError(f"GET /metrics: {exc or type(exc).__name__}") from exc
        if resp.status != 200:
            raise TransportError(f"GET /metrics returned HTTP {resp.status}")
        return resp.body.decode("utf-8", "replace")

    async def send(self, request: WireRequest) -> Exchange:
        body = self._body(request)
        ex = Exchange()
        stream = _SseStream(ex, self.endpoint == "chat")
        ex.start_ns = time.perf_counter_ns()
        try:
            resp = await self._opened().request("POST", self._path, body, f"Content-Type: application/json\r\n"
                                                f"X-Request-Id: {request.request_id}\r\n", stream.take,
                                                self.timeout_s, count_events=True)
            ex.end_ns = resp.end_ns  # the arrival of the response's last bytes, stamped like the chunks
            if resp.status != 200:
                ex.error = f"http_{resp.status}"
                ex.error_detail = resp.body[:300].decode("utf-8", "replace")
        except asyncio.TimeoutError:
            ex.error, ex.error_detail = ErrorKind.TIMEOUT, f"no complete answer within {self.timeout_s:g} s"
        except ResponseError as exc:
            ex.error, ex.error_detail = exc.kind, str(exc)
        if not ex.end_ns:
            ex.end_ns = time.perf_counter_ns()
        if ex.error is None:
            ex.error, ex.error_detail = stream.problem()
        if ex.error is None:
            # the prompt's length in the server's tokens: the ids sent, or (chat: text) its own count
            check_complete(ex, request.max_tokens, len(request.prompt) if self.endpoint == "completions" else None)
        return ex

    def _body(self, request: WireRequest) -> bytes:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "min_tokens": request.max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.user:
            body["user"] = request.user
        if request.acceptance_length is not None:
            body["acceptance_length"] = request.acceptance_length
        if self.endpoint == "completions":
            body["prompt"] = request.prompt
        else:
            text = " ".join(map(str, request.prompt.tolist()))
            body["messages"] = [{"role": "user", "content": text}]
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


class _SseStream:
    """Turns SSE lines into the Exchange's chunk times, token counts and usage."""

    __slots__ = ("ex", "chat", "done", "error", "detail", "_count")

    def __init__(self, ex: Exchange, chat: bool) -> None:
        self.ex = ex
        self.chat = chat
        self.done = False
        self.error: str | None = None
        self.detail: str | None = None
        self._count = content_token_counter()  # looked up once a response, not once a read

    def take(self, pieces: Sequence[bytes | None], stamps: list[int], counts: list[int] | None = None) -> None:
        """A batch of body pieces (whole lines) and the arrival of each, and each one's tokens when
        the compiled reader counted them (connection.BodySink: a counted piece is None)."""
        if self.error is not None:
            return
        if counts is not None:  # counted as they were read: 0 where the line rules read the piece
            self._record(pieces, stamps, counts)
            return
        read = cast("list[bytes]", pieces)  # not counted: each piece is its bytes
        if self._count is not None:  # compiled: each piece's count, 0 where the line rules read it
            self._record(read, stamps, self._count(read))
            return
        whole = len(read)
        last = read[-1]
        if b"[DONE]" in last or last[-2:] != b"\n\n":
            whole -= 1  # the end of the stream, or a piece of several or partial lines
        taken = self._content_chunks(read[:whole], stamps) if whole else 0
        for piece, now in zip(read[taken:], stamps[taken:]):
            self._lines(piece, now)

    def _content_chunks(self, pieces: list[bytes], stamps: list[int]) -> int:
        """The Python path's fast path: when every piece is one event, parse them all in one go
        and record the content chunks with token ids; any other event (a role-only or text-only
        chunk, usage, an error) goes through the line rules in its place, so order is kept. How
        many pieces were taken: all, or 0 when the pieces are not one event each."""
        # One event per piece: each piece opens with `data:` and ends with the blank line (a
        # separator counted across pieces would let a piece of two events and a piece cut after
        # its first newline balance out, and give an event the next one's stamp), and no newline
        # is left but the last piece's two (memchr finds the first: cheaper than counting them).
        if not all(piece.startswith(b"data:") and piece.endswith(b"\n\n") for piece in pieces):
            return 0
        text = b"".join(pieces)
        body = text.replace(b"\n\ndata:", b",")  # each of the 7-byte separators becomes 1 byte
        if len(text) - len(body) != 6 * (len(pieces) - 1) or body.find(b"\n") != len(body) - 2:
            return 0
        try:
            events = orjson.loads(b"[" + body[5:-2] + b"]")
        except orjson.JSONDecodeError:
            return 0
        if len(events) != len(pieces):  # a piece holding two JSON values (`data: {...},{...}`): malformed
            return 0
        # The usual batch: every event a content chunk with token ids and no usage (some servers
        # send usage on every content chunk), counted in one pass.
        try:  # token ids that are not a list (a string has a length too) count 0: the line rules refuse them
            counts = [len(ids) if (ids := event["choices"][0]["token_ids"]).__class__ is list else 0
                      for event in events if "usage" not in event]
        except (LookupError, TypeError):
            counts = []  # some event of another shape: counted one by one below
        if len(counts) != len(events):
            counts = [_chunk_tokens(event) for event in events]
        self._record(pieces, stamps, counts)
        return len(events)

    def _record(self, pieces: Sequence[bytes | None], stamps: list[int], counts: list[int]) -> None:
        """Records each piece's content chunk of counts[k] tokens; a piece counted 0 (an empty
        token_ids list, where the text decides; no ids; usage; [DONE]; an error; several or
        partial lines) goes through the line rules in its place, between the runs around it."""
        first = 0  # the first piece of the run of content chunks not yet recorded
        for _ in range(counts.count(0)):  # none in the usual batch
            k = counts.index(0, first)
            self.ex.chunk_ns += stamps[first:k]
            self.ex.chunk_tokens += counts[first:k]
            first = k + 1
            self._lines(cast(bytes, pieces[k]), stamps[k])  # counted 0: its bytes
            if self.error is not None:
                return  # nothing after an error counts, as on the line path
        self.ex.chunk_ns += stamps[first:len(counts)]
        self.ex.chunk_tokens += counts[first:]

    def _lines(self, piece: bytes, now: int) -> None:
        for line in piece.split(b"\n"):
            if len(line) > 1:  # SSE's blank separator lines ("" or "\r") carry nothing
                self.line(line, now)

    def line(self, line: bytes, now: int) -> None:
        """One SSE line (without its newline) that arrived at `now`."""
        if line[:5] != b"data:" or self.error is not None:
            return  # comments, event names; blank separators never get here
        payload = line[5:]  # JSON allows the leading space
        # `in` the last 8 bytes, not `==` the last 6: CRLF servers leave a `\r` after [DONE].
        if b"[DONE]" in payload[-8:] and payload.strip() == b"[DONE]":
            self.done = True
            return
        try:
            event = orjson.loads(payload)
            choices = event.get("choices")
            if choices:
                choice = choices[0]
                ids = choice.get("token_ids")  # the hot path: one dict lookup when the server sends ids
                if ids is not None and ids.__class__ is not list:
                    raise TypeError(f"token_ids is a {type(ids).__name__}, not a list of token ids")
                tokens = len(ids) if ids else _content_tokens(choice, self.chat)
                if tokens:
                    self.ex.chunk_ns.append(now)
                    self.ex.chunk_tokens.append(tokens)
            elif "error" in event:
                self.error, self.detail = ErrorKind.PROTOCOL, str(event["error"])[:300]
                return
            usage = event.get("usage")
            if usage:
                _take_usage(self.ex, usage)
        except orjson.JSONDecodeError:
            self.error, self.detail = ErrorKind.PROTOCOL, f"bad SSE data: {payload.strip()[:200]!r}"
        except (AttributeError, TypeError, KeyError, IndexError, ValueError) as exc:
            # valid JSON of the wrong shape (`[1]`, `"choices": ["x"]`, `"usage": 5`)
            self.error = ErrorKind.PROTOCOL
            self.detail = (f"SSE event is not an OpenAI stream chunk ({type(exc).__name__}: {exc}): "
                           f"{payload.strip()[:200]!r}")

    def problem(self) -> tuple[str | None, str | None]:
        if self.error is not None:
            return self.error, self.detail
        if not self.done:
            return ErrorKind.TRUNCATED, "stream ended without [DONE]"
        return None, None


def _chunk_tokens(event: Any) -> int:
    """A parsed event's tokens when it is a content chunk with token ids and no usage, else 0."""
    try:
        ids = event["choices"][0]["token_ids"]
        n = len(ids) if ids.__class__ is list else 0
    except (LookupError, TypeError):
        return 0
    return 0 if n and event.get("usage") else n  # n > 0: the event is an object


def _content_tokens(choice: dict, chat: bool) -> int:
    """Tokens a streamed choice carries: 0 for role-only or finish-only chunks."""
    ids = choice.get("token_ids")
    if ids:
        return len(ids)
    if chat:
        delta = choice.get("delta") or {}
        return 1 if (delta.get("content") or delta.get("reasoning_content")) else 0
    if choice.get("text"):
        return 1
    # An empty text with no finish reason is still a token (e.g. half of a UTF-8 character).
    return 1 if "text" in choice and choice.get("finish_reason") is None else 0


def _take_usage(ex: Exchange, usage: dict) -> None:
    """The usage chunk's counts; ValueError (a protocol error) for one that is not a count."""
    ex.usage_prompt_tokens = _count(usage, "prompt_tokens")
    ex.usage_completion_tokens = _count(usage, "completion_tokens")
    ex.cached_tokens = _count(usage.get("prompt_tokens_details") or {}, "cached_tokens")
    spec = usage.get("spec_decode")
    if isinstance(spec, dict):
        ex.spec_num_drafts = _count(spec, "num_drafts")
        ex.spec_num_accepted_tokens = _count(spec, "num_accepted_tokens")


MAX_COUNT = 10**9  # no count of tokens or steps in one request's usage comes near it


def _count(fields: dict, name: str) -> int | None:
    """An optional count: absent or null is None; anything but an integer in [0, MAX_COUNT] is refused."""
    value = fields.get(name)
    if value is None:
        return None
    if value.__class__ is not int or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"usage field {name} is not a count: {str(value)[:40]}")
    return value


def check_complete(ex: Exchange, asked: int, isl: int | None = None) -> None:
    """A finished stream's counts against what was asked and received: fewer tokens than asked is
    a truncated stream; more tokens than asked (streamed or in usage), or more cached prompt tokens
    than the prompt has, are numbers the server cannot have and a protocol error, never believed."""
    got = ex.output_tokens
    prompt = isl if isl is not None else ex.usage_prompt_tokens
    if got < asked or not ex.chunk_ns:
        ex.error = ErrorKind.TRUNCATED
        ex.error_detail = f"asked for {asked} tokens, got {got}"
    elif max(ex.counted_tokens, got) > asked:
        ex.error = ErrorKind.PROTOCOL
        ex.error_detail = (f"asked for {asked} tokens (max_tokens), got more: {ex.counted_tokens} streamed, "
                           f"{ex.usage_completion_tokens} in usage")
    elif ex.cached_tokens is not None and prompt is not None and ex.cached_tokens > prompt:
        ex.error = ErrorKind.PROTOCOL
        ex.error_detail = f"usage says {ex.cached_tokens} cached prompt tokens, more than the prompt's {prompt}"


def parse_server_info(models: list, wanted: str | None, where: str) -> ServerInfo:
    """Pick the model entry (`wanted`, else the first) out of a /v1/models `data` list."""
    if not isinstance(models, list) or not models:
        raise TransportError(f"{where}: the server lists no models")
    entry = models[0]
    if wanted is not None:
        matches = [m for m in models if isinstance(m, dict) and m.get("id") == wanted]
        entry = matches[0] if matches else {"id": wanted}
    if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
        raise TransportError(f"{where}: model entry without an id: {entry!r}")
    ours = entry.get("owned_by") == "agentload"

    def int_field(name: str) -> int | None:
        value = entry.get(name)
        return value if isinstance(value, int) and value > 0 else None

    return ServerInfo(
        model=entry["id"],
        ours=ours,
        max_model_len=int_field("max_model_len"),
        num_gpus=int_field("num_gpus") if ours else None,
        vocab_size=int_field("vocab_size"),
        raw=entry,
    )
