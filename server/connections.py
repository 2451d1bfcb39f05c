"""aiohttp's app runner, with our connection handler: half-closed HTTP/1.0 requests and parser errors.

A client may half-close its connection once its request is sent (shutdown(SHUT_WR), HTTP/1.0
style) and then read the response until the server closes. aiohttp closes a connection at the
client's EOF and cancels its handler, so such a client got no response. Here a connection whose
newest request is HTTP/1.0 and complete stays open at EOF until that request's response is
written, then closes. Any other EOF still means the client left: the connection closes and the
request is aborted in the engine at once (an HTTP/1.1 client closing its socket while it waits
for a whole response looks, at the TCP level, just like a half-close).

Requests aiohttp's HTTP parser refuses (a bad request line, header or Content-Length) and
unhandled exceptions get OpenAI-style JSON error bodies, like every error of server/api.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http import HttpVersion10
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from server.protocol import ApiError, ErrorCode

logger = logging.getLogger(__name__)


class AppRunner(web.AppRunner):
    """web.AppRunner whose server makes `_Connection`s; `on_rejected(code)` counts each request the
    HTTP parser refuses, as the app counts the ones it refuses."""

    def __init__(self, app: web.Application, *, on_rejected: Callable[[str], None], **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._on_rejected = on_rejected

    async def _make_server(self) -> web.Server:
        # web.Server names the connection class it makes; the same server as a _Server makes ours.
        made = await super()._make_server()
        server = _Server(made.request_handler, request_factory=made.request_factory,
                         handler_cancellation=made.handler_cancellation, loop=made._loop, **made._kwargs)
        server.on_rejected = self._on_rejected
        return server


class _Server(web.Server):
    on_rejected: Callable[[str], None]

    def __call__(self) -> RequestHandler:
        connection = _Connection(self, loop=self._loop, **self._kwargs)
        connection.on_rejected = self.on_rejected
        return connection


class _Connection(RequestHandler):
    """One client connection: answers a half-closed HTTP/1.0 request; JSON error bodies."""

    __slots__ = ("_http10_body", "on_rejected")
    on_rejected: Callable[[str], None]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._http10_body: StreamReader | None = None  # the newest request's body, if HTTP/1.0

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._messages:  # the newest request parsed; start() takes them from the other end
            message, payload = self._messages[-1]
            self._http10_body = payload if getattr(message, "version", None) == HttpVersion10 else None

    # asyncio.Protocol's contract: True keeps the transport open (aiohttp's annotation says None).
    def eof_received(self) -> bool:  # type: ignore[override]
        idle = self._waiter is not None and not self._waiter.done()  # every request answered
        body = self._http10_body
        if idle or body is None or not body.is_eof():
            return False  # the transport closes, which cancels the handler
        self._close = True  # nothing can follow: close once this response is written
        return True

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        error = _error(status, message)
        if status >= 500:
            super().handle_error(request, status, exc, message)  # logs it; raises once a response was under way
        else:
            # A malformed request is the client's fault: one line, no traceback.
            logger.warning("refused a request from %s: %s", request.remote, error.message)
            if request.writer.output_size > 0:
                raise ConnectionError("a response was under way; cannot send the parser's error")
        self.on_rejected(str(error.code))
        response = web.Response(status=status, body=error.body(), content_type="application/json")
        response.force_close()
        return response


def _error(status: int, parser_message: str | None) -> ApiError:
    if status >= 500:
        return ApiError(status, HTTPStatus(status).phrase.lower(), type="server_error", code=ErrorCode.INTERNAL_ERROR)
    # The parser's message: a first line like "Invalid character in Content-Length:", then the bytes.
    reason = (parser_message or HTTPStatus(status).phrase).splitlines()[0].rstrip(" :")
    return ApiError(status, f"malformed HTTP request: {reason}", code=ErrorCode.INVALID_HTTP)

