"""The compiled read path: the extension module `_readpath` (loadgen/transport/_readpath.c), where it
is built from this source.

Where it is built, a plain-http connection on Linux is read by its `Reader`, a C callable
registered as the loop's reader callback: the recvmsg, the stamp, the body framing (chunked,
Content-Length, read-until-close) and the split into pieces of lines run in one compiled call per
read, no Python frame; it calls back into the connection (loadgen/transport/connection.py) when a
response head is complete (httptools parses it), for every batch of pieces, and at the message's
end or a failure. The pieces, stamps, batches and errors are the same as on the Python path (the
wire tests run both), but for a head or trailer over 64 KiB, malformed here only; https, other
systems, a checkout built without a C compiler and one whose build is of an older source (its
READ_PATH_VERSION is not this module's) take the Python path. The reader keeps a batch's pieces
and their stamps itself until the connection takes them (`deliver`); with `count_events` it also
counts each piece that is one plain SSE content event as it reads it (while its bytes are in the
cache, instead of once more at the batch) and hands it over as its count alone, the piece None.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

READ_PATH_VERSION = 4  # _readpath.c's: a build of another source is not used


def _current_build(module: Any) -> Any:
    """The compiled read path's module when it was built from this source (its READ_PATH_VERSION
    matches), else None: a build of an older source left in a checkout takes the Python paths."""
    return module if getattr(module, "READ_PATH_VERSION", None) == READ_PATH_VERSION else None


try:
    from loadgen.transport import _readpath as _built  # type: ignore[attr-defined]  # the compiled read path
except ImportError:  # built without a C compiler: the Python path reads every connection
    _built = None
_readpath = _current_build(_built)

NO_BODY, BODY_CHUNKED, BODY_UNTIL_CLOSE = -1, -2, -3  # framings besides a length (_readpath.c's)
WHOLE, PIECES, COUNTED = 0, 1, 2  # how a body reaches the connection (take_head; _readpath.c's)


def compiled_reads_available() -> bool:
    """Whether plain-http connections can be read by the compiled reader (built, and Linux)."""
    return _readpath is not None and sys.platform.startswith("linux")


def content_token_counter() -> Callable[[list[bytes]], list[int]] | None:
    """The compiled counter of a batch of SSE content events' token ids, one count per piece and
    0 for a piece it leaves to orjson (_readpath.c's count_content_tokens, used by
    http._SseStream), or None where the extension is not built."""
    return _readpath.count_content_tokens if _readpath is not None else None


def new_reader(fd: int, conn: Any, lost: Callable[[Exception | None], None]) -> Any:
    """The compiled reader of socket `fd`, feeding `conn` (a connection.Connection); only where
    `compiled_reads_available()`."""
    assert _readpath is not None, "the compiled read path is not built"
    return _readpath.Reader(fd, conn, lost)


def configure(offset: Callable[[], int], refresh_ns: int, read_size: int, batch_pieces: int) -> None:
    """The reader's clock (CLOCK_REALTIME - CLOCK_MONOTONIC and how often it is re-read), read size
    and batch size: the Python path's own, so both paths stamp and batch alike."""
    if _readpath is not None:
        _readpath.configure(offset, refresh_ns, read_size, batch_pieces)


@functools.cache  # once per process
def warn_python_reads() -> None:
    log.warning("the compiled read path (loadgen/transport/_readpath.c) is not built, or was built from an older "
                "source: plain-http reads take the Python path, a few CPU-microseconds more per streamed token "
                "(rebuild: pip install -e . with a C compiler)")

