"""Refusals: `ApiError`, an HTTP status with an OpenAI-style error body, and its `ErrorCode`s."""

from __future__ import annotations

from enum import Enum
from typing import Any

import orjson


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
    CLIENT_GONE = "client_gone"  # the client closed its connection before its request body was in
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


def invalid(param: str, message: str) -> ApiError:
    """400 invalid_value for `param`, the message prefixed with its name."""
    return ApiError(400, f"{param}: {message}", param=param, code=ErrorCode.INVALID_VALUE)


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, as error messages say it."""
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
             dict: "object", type(None): "null"}
    return names.get(type(value), type(value).__name__)
