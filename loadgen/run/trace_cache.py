"""A cache of parsed bundled trace sets, so a replay reaches its first request quickly.

Parsing and validating the bundled agentic-coding sessions checks every hash id, which is most
of a replay's start-up. Only sets shipped inside the traces package are cached, keyed by their files and
the package's own source files (size and mtime), so a new or edited trace file, or a new reader,
never meets a stale entry. A home without a writable cache folder (containers often have one)
uses a folder in the temporary directory instead; any other problem (unreadable entry, no
writable folder at all) falls back to parsing.

The entry is not the pickled TraceSet: its requests hold hash ids by the million but distinct
ones only by the thousand, because each request of a conversation repeats the ids of the one
before it and adds a few, and unpickling every id as its own int would dominate the start-up.
The entry stores each request's ids as (an earlier request of the same session,
how many leading ids they share, the ids after those), and reading it back builds each tuple
from the earlier one's slice.
"""

from __future__ import annotations

import gc
import hashlib
import os
import pickle
import sys
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import traces
from traces import Request, Session, Subagent, TraceSet, bundled_sets, load_traces

FORMAT = "v2"  # the entry layout below; part of the file name so an older layout is never read
BASE_CANDIDATES = 8  # earlier requests tried as the base of a request's hash ids
_REQUEST_FIELDS = tuple(f.name for f in fields(Request))
_HASH_IDS = _REQUEST_FIELDS.index("hash_ids")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentload" / "traces"


def _cache_dirs() -> list[Path]:
    """Where entries are looked for and kept, in order of preference."""
    user = f"-{os.getuid()}" if hasattr(os, "getuid") else ""
    return [cache_dir(), Path(tempfile.gettempdir()) / f"agentload{user}" / "traces"]


def load_traces_cached(source: str, fmt: str, freeze: bool = False) -> TraceSet:
    """`traces.load_traces(source, fmt)`, through the cache when `source` names a bundled set.
    freeze: see `unpack` (for a caller that keeps the set for its process's life and unfreezes)."""
    if Path(source).exists() or source not in bundled_sets():
        return load_traces(source, fmt)
    name = f"{source}-{fmt}-{FORMAT}-{_fingerprint(source)}.pickle"
    for folder in _cache_dirs():
        try:
            with open(folder / name, "rb") as handle:
                return unpack(pickle.load(handle), freeze)
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError,
                IndexError):
            pass
    loaded = load_traces(source, fmt)
    entry = pack(loaded)
    for folder in _cache_dirs():
        if _store(folder / name, entry):
            break
    return loaded


@dataclass(frozen=True)
class PackedTraces:
    """A trace set in the cache entry's form, pickled once: what travels to worker processes and
    Ray actors. Plain tuples with delta-coded hash ids are a fraction of the TraceSet's own pickle
    and quicker to rebuild than that is to unpickle, and they are pickled once, not per worker."""

    data: bytes

    @classmethod
    def of(cls, trace_set: TraceSet) -> PackedTraces:
        return cls(pickle.dumps(pack(trace_set), protocol=pickle.HIGHEST_PROTOCOL))

    def unpack(self, freeze: bool = False) -> TraceSet:
        return unpack(pickle.loads(self.data), freeze)


def pack(trace_set: TraceSet) -> tuple:
    """The cache entry of a trace set: plain tuples, each request's hash ids delta-coded."""
    return (trace_set.name, trace_set.format, trace_set.block_size,
            tuple(_pack_session(session) for session in trace_set.sessions))


def unpack(entry: tuple, freeze: bool = False) -> TraceSet:
    """Inverse of `pack`; raises TypeError/ValueError/IndexError on an entry of another shape.
    freeze: gc.freeze() the heap before the collector is enabled again, for a caller that keeps the
    set for its process's life (and calls gc.unfreeze() when done): otherwise the next allocations
    collect the set's million-odd young objects at once, a pause in every start-up."""
    name, fmt, block_size, sessions = entry
    collecting = gc.isenabled()
    gc.disable()  # the collector would walk the growing id tuples again and again: half the time
    try:
        return TraceSet(name, fmt, block_size, tuple(_unpack_session(session) for session in sessions))
    finally:
        if freeze:
            gc.freeze()
        if collecting:
            gc.enable()


def _pack_session(session: Session) -> tuple:
    earlier: list[tuple[int, ...]] = []  # hash ids of the session's requests packed so far
    subagents = tuple((_values(sub, "requests"), tuple(_pack_request(r, earlier) for r in sub.requests))
                      for sub in session.subagents)
    requests = tuple(_pack_request(r, earlier) for r in session.requests)
    return _values(session, "requests", "subagents"), requests, subagents


def _unpack_session(packed: tuple) -> Session:
    rest, requests, subagents = packed
    earlier: list[tuple[int, ...]] = []  # same order as packing
    subs = tuple(Subagent(**_named(Subagent, values, "requests"),
                          requests=tuple(_unpack_request(r, earlier) for r in sub_requests))
                 for values, sub_requests in subagents)
    parent = tuple(_unpack_request(r, earlier) for r in requests)
    return Session(**_named(Session, rest, "requests", "subagents"), requests=parent, subagents=subs)


def _values(record: Any, *leave_out: str) -> tuple:
    return tuple(getattr(record, f.name) for f in fields(record) if f.name not in leave_out)


def _named(cls: Any, values: tuple, *left_out: str) -> dict[str, Any]:
    return dict(zip([f.name for f in fields(cls) if f.name not in left_out], values, strict=True))


def _pack_request(request: Request, earlier: list[tuple[int, ...]]) -> tuple:
    values = list(_values(request))
    ids = values[_HASH_IDS]
    base, shared = _base(earlier, ids)
    earlier.append(ids)
    values[_HASH_IDS] = (base, shared, ids[shared:])
    return tuple(values)


def _unpack_request(packed: tuple, earlier: list[tuple[int, ...]]) -> Request:
    values = list(packed)
    base, shared, rest = values[_HASH_IDS]
    source = earlier[base] if shared else ()
    ids = source if shared == len(source) and not rest else source[:shared] + rest
    earlier.append(ids)
    values[_HASH_IDS] = ids
    return Request(*values)


def _base(earlier: list[tuple[int, ...]], ids: tuple[int, ...]) -> tuple[int, int]:
    """(position of the earlier request to copy from, how many leading ids to copy): the longest
    of the last few requests that `ids` extends, else the common prefix with the latest one."""
    base, shared = -1, 0
    for position in range(max(0, len(earlier) - BASE_CANDIDATES), len(earlier)):
        candidate = earlier[position]
        if shared < len(candidate) <= len(ids) and ids[:len(candidate)] == candidate:
            base, shared = position, len(candidate)
    if not shared and earlier:
        base, shared = len(earlier) - 1, _common_prefix(earlier[-1], ids)
    return base, shared


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the longest common prefix, by bisection on slice equality (compared in C)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _fingerprint(name: str) -> str:
    package = Path(traces.__file__).parent
    files = sorted((package / "data" / name).iterdir()) + sorted(package.glob("*.py"))
    digest = hashlib.sha256(sys.version.encode())
    for file in files:
        stat = file.stat()
        digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()[:16]


def _store(path: Path, entry: Any) -> bool:
    """Write the entry atomically; False when the folder cannot take it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as handle:
            pickle.dump(entry, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(handle.name, path)
    except OSError:
        return False
    return True
