"""`server start`'s HTTP flags (`HttpConfig`) and the environment variable that may hold its API key."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from server.config.flags import cli, require

_HTTP = "HTTP"
API_KEY_ENV = "AGENTLOAD_API_KEY"  # the API key, when neither --api-key nor --api-key-file gives it


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """`server start`'s HTTP side: where it listens, who may call it, how much it queues."""

    host: str = field(default="127.0.0.1", metadata=cli("--host", group=_HTTP, help="address to bind"))
    port: int = field(default=8000, metadata=cli(
        "--port", group=_HTTP, help="port to bind; 0 picks a free one, printed on the ready line"))
    api_key: str | None = field(default=None, metadata=cli(
        "--api-key", group=_HTTP, default_text=f"${API_KEY_ENV}, else none",
        help="require 'Authorization: Bearer KEY' on /v1 routes (a command line is visible to other "
             f"users in ps: prefer --api-key-file or ${API_KEY_ENV})"))
    api_key_file: str | None = field(default=None, metadata=cli(
        "--api-key-file", group=_HTTP, metavar="PATH", help="read --api-key's KEY from PATH (one line)"))
    max_body_mb: float = field(default=32.0, metadata=cli(
        "--max-body-mb", group=_HTTP, help="largest request body in MiB; larger ones get 413"))
    max_queue: int = field(default=1024, metadata=cli(
        "--max-queue", group=_HTTP,
        help="requests allowed to wait beyond --max-num-seqs running ones; more get 503 with Retry-After"))
    served_model_name: str | None = field(default=None, metadata=cli(
        "--served-model-name", group=_HTTP, default_text="the preset name",
        help="model id in /v1/models and responses"))
    shutdown_timeout: float = field(default=30.0, metadata=cli(
        "--shutdown-timeout", group=_HTTP,
        help="on SIGTERM/SIGINT, seconds to let running requests finish; then (or at a second signal) "
             "the rest are cut and the exit code is 3"))
    read_timeout: float = field(default=10.0, metadata=cli(
        "--read-timeout", group=_HTTP, metavar="S",
        help="a client must send a complete request head within S seconds of connecting (or of its "
             "previous response; idle keep-alive connections close then too) and its body within S more "
             "(else 408, and the connection closes S later at most)"))

    def __post_init__(self) -> None:
        require(0 <= self.port <= 65535, f"--port: must be in 0..65535, got {self.port}")
        require(math.isfinite(self.max_body_mb) and self.max_body_mb > 0,
                f"--max-body-mb: must be a positive number, got {self.max_body_mb}")
        require(self.max_queue >= 0, f"--max-queue: must be >= 0, got {self.max_queue}")
        require(self.shutdown_timeout >= 0, f"--shutdown-timeout: must be >= 0, got {self.shutdown_timeout}")
        require(self.api_key != "", "--api-key: must not be empty")
        require(self.api_key is None or self.api_key_file is None, "--api-key-file: give it or --api-key, not both")
        require(self.read_timeout > 0, f"--read-timeout: must be > 0, got {self.read_timeout}")

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 2**20)

    def read_api_key(self) -> str | None:
        """The key /v1 routes require: --api-key, else the one line of --api-key-file, else
        $AGENTLOAD_API_KEY if set and not empty; None: no key."""
        if self.api_key_file is None:
            return self.api_key or os.environ.get(API_KEY_ENV) or None
        try:
            with open(self.api_key_file, encoding="utf-8") as file:
                key = file.read().strip()
        except OSError as exc:
            raise ValueError(f"--api-key-file: cannot read {self.api_key_file}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ValueError(f"--api-key-file: {self.api_key_file} is not UTF-8 text") from None
        require(key != "" and "\n" not in key, f"--api-key-file: {self.api_key_file} must hold the key on one line")
        return key
