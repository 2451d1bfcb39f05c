"""The aiohttp application: OpenAI-compatible routes, SSE streaming, auth, admission and errors.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
GET /metrics. Every error leaves as an OpenAI-style body (`{"error": {...}}`), including
aiohttp's own 404/405/413 and its HTTP parser's 400s (server/connections.py). `--api-key` guards
the /v1 routes; /health and /metrics stay open for probes and scrapers.

The handlers do per-step work only: one engine step's tokens for a request become one SSE
chunk (several tokens with speculative decoding), and chunks that piled up while the handler
was busy are written in one call. A streamed response sends its headers with the first engine
output, so a request the engine refuses still gets a 400 (or 503 if the engine is gone); after
that, failures are reported in-band as an SSE `data: {"error": ...}` event without `[DONE]`.

Shutdown (`drain`): new requests get 503 `shutting_down`; running ones may finish until the
deadline, then each is cut: a streamed one gets an SSE error event (code `server_shutdown`),
`[DONE]` and the end of its chunked body; one that has sent nothing yet gets 503
`server_shutdown`. Slow clients are bounded by `read_timeout_s`: a request head must be complete
within it of the connection opening or of the previous response (aiohttp's keep-alive timer
closes such connections), a body within it of the head (else 408).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
import uuid
from dataclasses import dataclass

import orjson
from aiohttp import web

from server import protocol
from server.config import HttpConfig
from server.engine.messages import AddRequest, RequestOutput
from server.engine_client import EngineClient, EngineDeadError, EngineInfo, RequestCutError, RequestStream
from server.gpu_metrics import GpuGauges
from server.launch import process_launch
from server.metrics import ServerMetrics
from server.protocol import ApiError, ErrorCode, GenerationOptions, ResponseHeader
from server.tokenizer import ByteTokenizer, StreamDecoder

_HTTP_ERROR_CODES = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED, 413: ErrorCode.REQUEST_TOO_LARGE}


READ_TIMEOUT_S = HttpConfig().read_timeout  # --read-timeout's default, defined in server/config/http.py


@dataclass(frozen=True, slots=True)
class ApiSettings:
    served_model_name: str
    api_key: str | None
    max_body_bytes: int
    max_queue: int  # requests allowed to wait beyond the engine's --max-num-seqs
    max_num_seqs: int
    read_timeout_s: float = READ_TIMEOUT_S  # request head (and body) must arrive within this
    retry_after_s: int = 1


CUT_WRITE_GRACE_S = 2.0  # at the shutdown deadline: time to write the final events of cut streams


class _Generation:
    """One request's running totals and text decoder; also records its latencies."""

    __slots__ = ("arrival", "last", "decoder", "num_tokens", "prompt_tokens", "cached_tokens",
                 "finish_reason", "error", "speculates", "spec")

    def __init__(self, arrival: float, speculates: bool) -> None:
        self.arrival = arrival
        self.last: float | None = None
        self.decoder = StreamDecoder()
        self.num_tokens = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.speculates = speculates
        self.spec: dict[str, int] = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}

    def absorb(self, output: RequestOutput, arrival: float, metrics: ServerMetrics) -> str:
        """Account one engine output; returns its text."""
        if output.new_token_ids:
            if self.last is None:
                metrics.ttft.observe(arrival - self.arrival)
            else:
                metrics.itl.observe(arrival - self.last)
            self.last = arrival
            self.num_tokens += len(output.new_token_ids)
        text = self.decoder.decode(output.new_token_ids)
        if output.num_prompt_tokens:
            self.prompt_tokens = output.num_prompt_tokens
            self.cached_tokens = output.num_cached_tokens
        if self.speculates:  # the engine's counts are cumulative per request: the last one is the total
            self.spec = {"num_drafts": output.num_drafts, "num_draft_tokens": output.num_draft_tokens,
                         "num_accepted_tokens": output.num_accepted_tokens}
        if output.finished:
            self.finish_reason = output.finish_reason
            self.error = output.error
            metrics.e2e.observe(arrival - self.arrival)
            metrics.observe_finished(output.finish_reason or "unknown")
            text += self.decoder.flush()
        return text

    def usage(self) -> dict[str, object]:
        return protocol.usage(self.prompt_tokens, self.num_tokens, self.cached_tokens,
                              self.spec if self.speculates else None)


class OpenAIServer:
    def __init__(self, client: EngineClient, info: EngineInfo, settings: ApiSettings,
                 tokenizer: ByteTokenizer) -> None:
        self.client = client
        self.info = info
        self.settings = settings
        self.tokenizer = tokenizer
        self.metrics = ServerMetrics(settings.served_model_name)
        self.gpus = GpuGauges(info.num_gpus // client.config.parallel.nnodes)  # this node's GPUs
        self.closing = False  # set on SIGTERM/SIGINT: new requests get 503
        self.cut_requests = 0  # requests ended by the shutdown deadline
        self._running: set[RequestStream] = set()
        self._idle = asyncio.Event()  # set whenever no request is running
        self._idle.set()
        self.created = int(time.time())
        self.speculative = client.config.speculative
        self.launch = process_launch()  # on the model card: how this server was started, for results to record

    @property
    def in_flight(self) -> int:
        """Requests admitted and not finished."""
        return len(self._running)

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body_bytes,
                              middlewares=[self._error_middleware])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        return app

    @web.middleware
    async def _error_middleware(self, request: web.Request, handler) -> web.StreamResponse:
        try:
            if self.settings.api_key is not None and request.path.startswith("/v1/"):
                self._check_api_key(request)
            return await handler(request)
        except ApiError as exc:
            return self._error_response(exc)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            headers = {k: v for k, v in exc.headers.items() if k == "Allow"}
            return self._error_response(ApiError(
                exc.status, f"{exc.reason}: {request.method} {request.path}",
                code=_HTTP_ERROR_CODES.get(exc.status), headers=headers))

    def _error_response(self, exc: ApiError) -> web.Response:
        self.metrics.observe_rejected(exc.code or str(exc.status))
        response = web.Response(status=exc.status, body=exc.body(), headers=exc.headers,
                                content_type="application/json")
        if exc.status == 408 or self.closing:
            response.force_close()  # the rest of a late body, or a server on its way out
        return response

    def _check_api_key(self, request: web.Request) -> None:
        # aiohttp decodes header bytes that are not UTF-8 to surrogates; they encode back as they came.
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, f"Bearer {self.settings.api_key}".encode()):
            raise ApiError(401, "missing or wrong API key (send 'Authorization: Bearer <key>')",
                           code=ErrorCode.INVALID_API_KEY)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        req = protocol.parse_completion_request(await self._read_body(request))
        self._check_model(req.options.model)
        prompt = req.prompt if isinstance(req.prompt, tuple) else tuple(self.tokenizer.encode(req.prompt))
        return await self._generate(request, prompt, req.options, req.ignored_fields, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        req = protocol.parse_chat_request(await self._read_body(request))
        self._check_model(req.options.model)
        prompt = tuple(self.tokenizer.apply_chat_template(req.messages))
        return await self._generate(request, prompt, req.options, req.ignored_fields, chat=True)

    async def _read_body(self, request: web.Request) -> bytes:
        try:
            return await asyncio.wait_for(request.read(), self.settings.read_timeout_s)
        except asyncio.TimeoutError:
            raise ApiError(408, f"request body not received within {self.settings.read_timeout_s:g} s "
                           f"(--read-timeout)", code=ErrorCode.REQUEST_TIMEOUT) from None
        except ConnectionResetError:
            # Nobody is left to answer, so this is counted (requests_rejected_total) and not logged as
            # a server fault; the middleware's response goes nowhere.
            raise ApiError(400, "the client closed its connection during the request body",
                           code=ErrorCode.CLIENT_GONE) from None

    async def drain(self, timeout_s: float, cut_now: asyncio.Event) -> int:
        """Refuse new requests; let running ones finish for up to `timeout_s` (or until `cut_now`
        is set), then cut the rest. Returns the number of requests cut."""
        self.closing = True
        waits = [asyncio.ensure_future(self._idle.wait()), asyncio.ensure_future(cut_now.wait())]
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        for waiting in waits:
            waiting.cancel()
        when = "at a second signal" if cut_now.is_set() else f"at the --shutdown-timeout deadline ({timeout_s:g} s)"
        for stream in list(self._running):
            stream.cut(f"server shutting down: request cut {when}")
        if not self._idle.is_set():
            # Bounded: a client that stopped reading could block a write; cleanup cancels it.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), CUT_WRITE_GRACE_S)
        return self.cut_requests

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.settings.served_model_name, "object": "model", "created": self.created,
                "owned_by": "agentload", "root": self.info.model_name,
                "max_model_len": self.info.max_model_len, "num_gpus": self.info.num_gpus,
                "vocab_size": self.info.vocab_size,
                "speculative": protocol.speculative_card(self.speculative), "launch": self.launch}
        return web.json_response({"object": "list", "data": [card]}, dumps=_dumps)

    async def health(self, request: web.Request) -> web.Response:
        body = {"status": "ok", "model": self.settings.served_model_name,
                "engine_pid": self.info.pid, "requests_in_flight": self.in_flight}
        status = 200
        if self.client.dead_reason is not None:
            body.update(status=ErrorCode.ENGINE_DEAD, reason=self.client.dead_reason)
            status = 503
        elif self.closing:
            body["status"] = "shutting_down"
            status = 503
        return web.json_response(body, status=status, dumps=_dumps)

    async def prometheus(self, request: web.Request) -> web.Response:
        gpus = await asyncio.to_thread(self.gpus.read) if self.gpus.enabled else None  # NVML calls block
        return web.Response(body=self.metrics.render(self.client.stats, self.in_flight, gpus),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    def _check_model(self, model: str | None) -> None:
        # A missing model means the served one (convenient for curl; OpenAI clients send it).
        if model is not None and model != self.settings.served_model_name:
            raise ApiError(404, f"model {model!r} does not exist; this server serves "
                           f"{self.settings.served_model_name!r}", param="model", code=ErrorCode.MODEL_NOT_FOUND)

    def _check_admission(self) -> None:
        if self.client.dead_reason is not None:
            raise ApiError(503, f"engine is not running: {self.client.dead_reason}",
                           type="server_error", code=ErrorCode.ENGINE_DEAD)
        if self.closing:
            raise ApiError(503, "server is shutting down", type="server_error", code=ErrorCode.SHUTTING_DOWN)
        waiting = self.in_flight - self.settings.max_num_seqs
        if waiting >= self.settings.max_queue:
            raise ApiError(503, f"server overloaded: {waiting} requests already waiting "
                           f"(--max-queue {self.settings.max_queue}); retry later",
                           type="server_error", code=ErrorCode.OVERLOADED,
                           headers={"Retry-After": str(self.settings.retry_after_s)})

    async def _generate(self, request: web.Request, prompt: tuple[int, ...], options: GenerationOptions,
                        ignored_fields: tuple[str, ...], chat: bool) -> web.StreamResponse:
        protocol.check_prompt(prompt, self.info.vocab_size)
        protocol.check_acceptance_length(options, self.speculative)
        max_tokens = protocol.resolve_max_tokens(options, len(prompt), self.info.max_model_len,
                                                 "messages" if chat else "prompt")
        self._check_admission()
        header = ResponseHeader(f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                                int(time.time()), self.settings.served_model_name, chat)
        headers: dict[str, str] = {}
        if ignored_fields:
            headers[protocol.IGNORED_FIELDS_HEADER] = protocol.ignored_fields_header(ignored_fields)
        arrival = time.monotonic()
        stream = self.client.submit(
            AddRequest(header.id, prompt, options.sampling_params(max_tokens), arrival))
        self._running.add(stream)
        self._idle.clear()
        try:
            gen = _Generation(arrival, self.speculative is not None)
            if options.stream:
                return await self._stream(request, stream, header, gen, options.include_usage, headers)
            return await self._complete(stream, header, gen, headers)
        except RequestCutError as exc:
            self.cut_requests += 1
            raise ApiError(503, str(exc), type="server_error", code=ErrorCode.SERVER_SHUTDOWN) from None
        finally:
            self._running.discard(stream)
            if not self._running:
                self._idle.set()
            if not stream.finished:
                self.client.abort(header.id)  # client gone or server stopping: free its blocks

    async def _complete(self, stream: RequestStream, header: ResponseHeader, gen: _Generation,
                        headers: dict[str, str]) -> web.Response:
        texts: list[str] = []
        token_ids: list[int] = []
        while gen.finish_reason is None:
            try:
                batch = await stream.next_batch()
            except EngineDeadError as exc:
                raise _engine_dead(exc) from None
            for output, arrival in batch:
                texts.append(gen.absorb(output, arrival, self.metrics))
                token_ids.extend(output.new_token_ids)
        if gen.error is not None:
            raise ApiError(400, gen.error, code=ErrorCode.ENGINE_REFUSED)
        body = header.full("".join(texts), token_ids, gen.finish_reason, gen.usage())
        return web.Response(body=body, content_type="application/json", headers=headers)

    async def _stream(self, request: web.Request, stream: RequestStream, header: ResponseHeader,
                      gen: _Generation, include_usage: bool, headers: dict[str, str]) -> web.StreamResponse:
        # Headers wait for the first engine output, so that a refusal by the engine (or its
        # death) before any token still gets a real status code instead of an in-band error.
        response: web.StreamResponse | None = None
        first = True
        try:
            while gen.finish_reason is None:
                parts: list[bytes] = []
                try:
                    batch = await stream.next_batch()
                except EngineDeadError as exc:
                    if response is None:
                        raise _engine_dead(exc) from None
                    # Mid-stream: report in-band and end without [DONE].
                    await response.write(protocol.sse_error(_engine_dead(exc)))
                    response.force_close()
                    return response
                except RequestCutError as exc:
                    if response is None:
                        raise
                    # Mid-stream at the shutdown deadline: say why, then end the stream cleanly
                    # ([DONE], and aiohttp's write_eof ends the chunked body).
                    self.cut_requests += 1
                    error = ApiError(503, str(exc), type="server_error", code=ErrorCode.SERVER_SHUTDOWN)
                    await response.write(protocol.sse_error(error) + protocol.SSE_DONE)
                    response.force_close()
                    return response
                for output, arrival in batch:
                    text = gen.absorb(output, arrival, self.metrics)
                    if gen.error is not None:
                        break
                    if output.new_token_ids or output.finished:
                        parts.append(header.chunk(text, output.new_token_ids,
                                                  output.finish_reason if output.finished else None,
                                                  first, include_usage))
                        first = False
                if gen.error is not None:
                    if response is None:
                        raise ApiError(400, gen.error, code=ErrorCode.ENGINE_REFUSED)
                    parts.append(protocol.sse_error(ApiError(400, gen.error, code=ErrorCode.ENGINE_REFUSED)))
                    response.force_close()
                elif gen.finish_reason is not None:
                    if include_usage:
                        parts.append(header.usage_chunk(gen.usage()))
                    parts.append(protocol.SSE_DONE)
                if response is None:
                    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                           "Cache-Control": "no-cache", **headers})
                    await response.prepare(request)
                await response.write(b"".join(parts))
        except ConnectionError:
            pass  # the client left; the caller aborts the request
        assert response is not None  # assigned in the loop's first pass, before its first write
        return response


def _engine_dead(exc: EngineDeadError) -> ApiError:
    return ApiError(503, f"engine is not running: {exc}", type="server_error", code=ErrorCode.ENGINE_DEAD)


def _dumps(obj: object) -> str:
    return orjson.dumps(obj).decode()
