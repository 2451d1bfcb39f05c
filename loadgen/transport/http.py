"""HTTP transport: OpenAI /v1/completions or /v1/chat/completions with streaming SSE over aiohttp.

One shared ClientSession with a keep-alive pool sized to the load. The stream is read with
`iter_any()` (whatever bytes arrived) and split into SSE lines here, so a read that carries
several events costs one wake-up, and no line-length limit applies. Each content chunk is
timestamped with perf_counter_ns when the bytes that carry it arrived.

Request body (completions): `prompt` = the token ids (exact input length), `max_tokens` =
`min_tokens` = the trace's output length, `ignore_eos`, `stream`, `stream_options.include_usage`.
Chat: one user message whose text is the token ids written as space-separated decimal numbers;
other tokenizers turn that into roughly one or two tokens per id, so use completions when the
input length must be exact.

Each request carries `X-Request-Id` (vLLM takes it as its request id; server logs then match
the per-request records). Tokens per content chunk: `len(choice["token_ids"])` when the server sends token ids (vLLM's
and our server's extension), else 1.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson

from loadgen.transport.base import (
    ERROR_CONNECT,
    ERROR_PROTOCOL,
    ERROR_RESET,
    ERROR_TIMEOUT,
    ERROR_TRUNCATED,
    Exchange,
    ServerInfo,
    Transport,
    TransportError,
    WireRequest,
)

ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
READ_BUFSIZE = 1 << 20  # long streams and long SSE lines arrive in few reads


class HttpTransport(Transport):
    def __init__(
        self,
        base_url: str,
        endpoint: str = "completions",
        model: str | None = None,
        api_key: str | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        if endpoint not in ENDPOINT_PATHS:
            raise ValueError(f"--endpoint: expected one of {', '.join(ENDPOINT_PATHS)}, got {endpoint!r}")
        self.base_url = base_url.rstrip("/")
        self.endpoint = endpoint
        self.model = model
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._url = self.base_url + ENDPOINT_PATHS[endpoint]
        self._session: aiohttp.ClientSession | None = None

    async def open(self, max_connections: int) -> None:
        connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, keepalive_timeout=60)
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self.headers,
            read_bufsize=READ_BUFSIZE,
            skip_auto_headers=("Accept-Encoding",),  # SSE must not be compressed
            auto_decompress=False,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def server_info(self) -> ServerInfo:
        url = self.base_url + "/v1/models"
        try:
            async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise TransportError(f"GET {url} returned HTTP {resp.status}: {body[:200]!r}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise TransportError(f"cannot reach the server at {self.base_url}: {exc or type(exc).__name__}") from exc
        try:
            models = orjson.loads(body)["data"]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise TransportError(f"GET {url}: not an OpenAI model list: {body[:200]!r}") from exc
        info = parse_server_info(models, self.model, url)
        self.model = info.model
        return info

    async def send(self, request: WireRequest) -> Exchange:
        body = self._body(request)
        ex = Exchange()
        ex.start_ns = time.perf_counter_ns()
        try:
            headers = {"X-Request-Id": request.request_id}
            async with self._session.post(self._url, data=body, headers=headers, timeout=self.timeout) as resp:
                if resp.status != 200:
                    ex.error = f"http_{resp.status}"
                    ex.error_detail = (await resp.read())[:300].decode("utf-8", "replace")
                else:
                    await self._read_stream(resp, ex)
        except asyncio.TimeoutError:
            ex.error, ex.error_detail = ERROR_TIMEOUT, f"no complete answer within {self.timeout.total:g} s"
        except aiohttp.ClientConnectorError as exc:
            ex.error, ex.error_detail = ERROR_CONNECT, str(exc)
        except (aiohttp.ClientError, ConnectionError) as exc:
            ex.error, ex.error_detail = ERROR_RESET, f"{type(exc).__name__}: {exc}"
        ex.end_ns = time.perf_counter_ns()
        if ex.error is None:
            _check_complete(ex, request.max_tokens)
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
        if self.endpoint == "completions":
            body["prompt"] = request.prompt
        else:
            text = " ".join(map(str, request.prompt.tolist()))
            body["messages"] = [{"role": "user", "content": text}]
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)

    async def _read_stream(self, resp: aiohttp.ClientResponse, ex: Exchange) -> None:
        chat = self.endpoint == "chat"
        chunk_ns, chunk_tokens = ex.chunk_ns, ex.chunk_tokens
        pending = b""
        done = False
        async for data in resp.content.iter_any():
            now = time.perf_counter_ns()
            pending += data
            if b"\n" not in data:
                continue
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments, event names
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    continue
                try:
                    event = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    ex.error, ex.error_detail = ERROR_PROTOCOL, f"bad SSE data: {payload[:200]!r}"
                    return
                if "error" in event:
                    ex.error, ex.error_detail = ERROR_PROTOCOL, str(event["error"])[:300]
                    return
                choices = event.get("choices")
                if choices:
                    tokens = _content_tokens(choices[0], chat)
                    if tokens:
                        chunk_ns.append(now)
                        chunk_tokens.append(tokens)
                usage = event.get("usage")
                if usage:
                    _take_usage(ex, usage)
        if not done:
            ex.error, ex.error_detail = ERROR_TRUNCATED, "stream ended without [DONE]"


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
    ex.usage_prompt_tokens = usage.get("prompt_tokens")
    ex.usage_completion_tokens = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details") or {}
    ex.cached_tokens = details.get("cached_tokens")


def _check_complete(ex: Exchange, asked: int) -> None:
    got = ex.output_tokens
    if got < asked or not ex.chunk_ns:
        ex.error = ERROR_TRUNCATED
        ex.error_detail = f"asked for {asked} tokens, got {got}"


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
