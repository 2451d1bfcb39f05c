"""Read trace files into typed records: session traces (JSON, gzip, JSONL, directories) and Mooncake JSONL.

Formats are detected from the first record (`requests` -> session trace, `input_length` ->
Mooncake) unless forced. Optional fields may be missing or null and get defaults; anything that
would make a replay wrong (missing token counts, negative lengths, more or fewer hash ids than the
input has full blocks) raises TraceError naming the file, the request path and the field.
"""

from __future__ import annotations

import gzip
import os
import zlib
from itertools import islice
from pathlib import Path
from typing import Any

import orjson

from traces.fields import (
    MAX_BLOCK,
    Where,
    check_object,
    opt_float,
    opt_int,
    opt_str,
    req_float,
    req_int,
    str_tuple,
)
from traces.schema import FORMATS, MOONCAKE, SESSIONS, Request, Session, Subagent, TraceError, TraceSet

DEFAULT_SET = "agentic-coding"
DATA_DIR = Path(__file__).parent / "data"
DEFAULT_BLOCK_SIZE = {SESSIONS: 64, MOONCAKE: 512}
TRACE_SUFFIXES = (".json", ".json.gz", ".jsonl", ".jsonl.gz")
_MAX_HASH_ID = 2**63 - 1  # ids travel through int64 arrays in synthesis and statistics


def bundled_sets() -> list[str]:
    """Names of the trace sets shipped inside the package."""
    if not DATA_DIR.is_dir():
        return []
    return sorted(p.name for p in DATA_DIR.iterdir() if p.is_dir() and _trace_files(p))


def load_traces(source: str | os.PathLike, fmt: str = "auto", block_size: int | None = None) -> TraceSet:
    """Load a bundled set name, a trace file or a directory of trace files.

    fmt: "auto" (detect per file), "sessions" or "mooncake". block_size: the tokens per hash id
    when the file does not say (defaults: 64 for sessions, 512 for Mooncake); a session file that
    states a different block size is an error.
    """
    if fmt not in ("auto", *FORMATS):
        raise TraceError(f"unknown trace format {fmt!r}: expected auto, {', '.join(FORMATS)}")
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1):
        raise TraceError(f"block_size must be a positive integer, got {block_size!r}")
    path = _resolve(source)
    files = _trace_files(path) if path.is_dir() else [path]
    if not files:
        raise TraceError(f"{path}: directory holds no trace files ({', '.join(TRACE_SUFFIXES)})")
    formats, sessions = set(), []
    for file in files:
        file_fmt, file_sessions = _read_file(file, fmt, block_size)
        formats.add(file_fmt)
        sessions.extend(file_sessions)
    if len(formats) > 1:
        raise TraceError(f"{path}: files mix trace formats ({', '.join(sorted(formats))}); load them separately")
    _check_unique_ids(sessions)
    sizes = {s.block_size for s in sessions}
    if len(sizes) > 1:
        raise TraceError(f"{path}: sessions use different block sizes {sorted(sizes)}")
    name = path.name if path.is_dir() else _stem(path)
    return TraceSet(name=name, format=formats.pop(), block_size=sizes.pop(), sessions=tuple(sessions))


def _resolve(source: str | os.PathLike) -> Path:
    path = Path(source)
    if path.exists():
        return path
    bundled = bundled_sets()
    if isinstance(source, str) and source in bundled:
        return DATA_DIR / source
    known = ", ".join(bundled) or "none"
    raise TraceError(f"{source}: no such file, directory or bundled trace set (bundled: {known})")


def _check_unique_ids(sessions: list[Session]) -> None:
    """Replays name sessions by id (and seed prompts with it), so two sessions may not share one."""
    seen: dict[str, str] = {}
    for session in sessions:
        if session.id in seen:
            raise TraceError(f"{session.source}: session id {session.id!r} is already used by {seen[session.id]}")
        seen[session.id] = session.source


def _trace_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))


def _stem(path: Path) -> str:
    name = path.name
    for suffix in sorted(TRACE_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def _read_file(path: Path, fmt: str, block_size: int | None) -> tuple[str, list[Session]]:
    records = _records(path)
    first = records[0][1]
    file_fmt = fmt if fmt != "auto" else _detect(path, first)
    if file_fmt == MOONCAKE:
        return file_fmt, [_mooncake_session(path, records, block_size or DEFAULT_BLOCK_SIZE[MOONCAKE])]
    stem = _stem(path)
    sessions = [
        _session(where, record, stem if len(records) == 1 else f"{stem}#{number}", block_size)
        for number, (where, record) in enumerate(records, start=1)
    ]
    return file_fmt, sessions


def _detect(path: Path, first: dict[str, Any]) -> str:
    if "requests" in first:
        return SESSIONS
    if "input_length" in first:
        return MOONCAKE
    keys = ", ".join(sorted(first)[:8]) or "none"
    raise TraceError(
        f"{path}: unknown trace format: the first record has neither 'requests' (session trace) "
        f"nor 'input_length' (Mooncake); its fields: {keys}"
    )


def _records(path: Path) -> list[tuple[Where, dict[str, Any]]]:
    """Parse a file as one JSON document (an object or an array of objects) or as JSONL."""
    source = str(path)
    try:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(f"{source}: cannot read: {exc}") from exc
    if not data.strip():
        raise TraceError(f"{source}: empty file")
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as whole_error:
        return _jsonl_records(source, data, whole_error)
    if isinstance(document, list):
        if not document:
            raise TraceError(f"{source}: empty JSON array")
        return [(check_object(Where(f"{source}:[{i}]"), item), item) for i, item in enumerate(document)]
    return [(check_object(Where(source), document), document)]


def _jsonl_records(source: str, data: bytes, whole_error: Exception) -> list[tuple[Where, dict[str, Any]]]:
    records: list[tuple[Where, dict[str, Any]]] = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        where = Where(f"{source}:line {number}")
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            # A first line that is not JSON on its own means the file was one (broken) document.
            if not records:
                raise TraceError(f"{source}: invalid JSON: {whole_error}") from exc
            raise TraceError(f"{where.source}: invalid JSON: {exc}") from exc
        records.append((check_object(where, record), record))
    return records


# ---- session traces ---------------------------------------------------------------------------


def _session(where: Where, record: dict[str, Any], default_id: str, block_size: int | None) -> Session:
    stated = opt_int(where, record, "block_size", positive=True)
    if stated is not None and stated > MAX_BLOCK:
        raise where.fail("block_size", f"must be at most {MAX_BLOCK:,} tokens per hash id, got {stated:,}")
    if stated is not None and block_size is not None and stated != block_size:
        raise where.fail("block_size", f"the file says {stated} but block_size={block_size} was asked for")
    size = stated or block_size or DEFAULT_BLOCK_SIZE[SESSIONS]
    items = record.get("requests")
    if not isinstance(items, list):
        raise where.fail("requests", "missing" if items is None else f"expected a list, got {type(items).__name__}")
    counter = _Counter()
    requests, subagents = _timeline(where, items, size, counter, allow_subagents=True)
    if not requests and not subagents:
        raise where.fail("requests", "empty: a session needs at least one request")
    if not requests and not any(sub.requests for sub in subagents):
        # Loaded, it would replay nothing at all: a lane that picks it sends no request.
        only = "its only item is a subagent" if len(subagents) == 1 else f"its {len(subagents)} items are subagents"
        raise where.fail("requests", f"the session has no request: no parent request, and {only} with no "
                                     f"requests of its own")
    return Session(
        id=opt_str(where, record, "id") or default_id,
        block_size=size,
        models=str_tuple(where, record, "models"),
        requests=requests,
        subagents=subagents,
        source=where.source,
        tool_tokens=opt_int(where, record, "tool_tokens"),
        system_tokens=opt_int(where, record, "system_tokens"),
        hash_id_scope=opt_str(where, record, "hash_id_scope"),
    )


class _Counter:
    """Hands out Request.index in file order across a session and its subagents."""

    def __init__(self) -> None:
        self.next = 0
        self.hash_ids: dict[int, int] = {}  # interns ids: sessions repeat each id in many requests

    def take(self) -> int:
        self.next += 1
        return self.next - 1


def _timeline(
    where: Where, items: list[Any], block_size: int, counter: _Counter, allow_subagents: bool
) -> tuple[tuple[Request, ...], tuple[Subagent, ...]]:
    requests: list[Request] = []
    subagents: list[Subagent] = []
    for i, item in enumerate(items):
        at = check_object(where.at(f"requests[{i}]"), item)
        previous_t = requests[-1].t if requests else 0.0
        if item.get("type") == "subagent":
            if not allow_subagents:
                raise at.fail("type", "a subagent inside a subagent is not supported")
            subagents.append(_subagent(at, item, len(requests), previous_t, block_size, counter))
        else:
            requests.append(_request(at, item, previous_t, block_size, counter))
    return tuple(requests), tuple(subagents)


def _subagent_start(recorded_t: float | None, duration_ms: float | None, previous_t: float) -> float:
    """A subagent's start on the parent's timeline.

    The recorded `t` is when the subagent *finished*: in every corpus session with subagents,
    t - duration_ms/1000 falls 0.2-0.9 s after the end of the parent call that launched it, and
    subagents launched together by one call share that start exactly. So the start is
    t - duration when both are known (never before the launching parent request).
    """
    if recorded_t is None:
        return previous_t
    if duration_ms is None:
        return recorded_t
    return max(previous_t, recorded_t - duration_ms / 1000.0)


def _subagent(
    where: Where, item: dict[str, Any], after: int, previous_t: float, block_size: int, counter: _Counter
) -> Subagent:
    items = item.get("requests")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise where.fail("requests", f"expected a list, got {type(items).__name__}")
    requests, _ = _timeline(where, items, block_size, counter, allow_subagents=False)
    recorded_t = opt_float(where, item, "t")
    duration_ms = opt_float(where, item, "duration_ms")
    return Subagent(
        agent_id=opt_str(where, item, "agent_id") or where.path,
        subagent_type=opt_str(where, item, "subagent_type"),
        t=_subagent_start(recorded_t, duration_ms, previous_t),
        after_request=after,
        duration_ms=duration_ms,
        total_tokens=opt_int(where, item, "total_tokens"),
        tool_use_count=opt_int(where, item, "tool_use_count"),
        status=opt_str(where, item, "status"),
        requests=requests,
        models=str_tuple(where, item, "models"),
        tool_tokens=opt_int(where, item, "tool_tokens"),
        system_tokens=opt_int(where, item, "system_tokens"),
    )


def _request(where: Where, item: dict[str, Any], previous_t: float, block_size: int, counter: _Counter) -> Request:
    kind = item.get("type", "n")
    if kind is None:
        kind = "n"
    if kind not in ("n", "s"):
        raise where.fail("type", f"unknown request type {kind!r}: expected 'n', 's' or 'subagent'")
    input_tokens = req_int(where, item, "in", positive=True)
    t = opt_float(where, item, "t")
    return Request(
        index=counter.take(),
        t=previous_t if t is None else t,
        input_tokens=input_tokens,
        output_tokens=req_int(where, item, "out"),
        hash_ids=_hash_ids(where, item.get("hash_ids"), input_tokens, block_size, counter.hash_ids, partial_last=False),
        think_time=opt_float(where, item, "think_time") or 0.0,
        api_time=opt_float(where, item, "api_time"),
        ttft=opt_float(where, item, "ttft"),
        model=opt_str(where, item, "model"),
        kind=kind,
        input_types=str_tuple(where, item, "input_types"),
        output_types=str_tuple(where, item, "output_types"),
        stop=opt_str(where, item, "stop"),
    )


# ---- Mooncake ---------------------------------------------------------------------------------


def _mooncake_session(path: Path, records: list[tuple[Where, dict[str, Any]]], block_size: int) -> Session:
    """All lines of a Mooncake file as one Session; hash ids are global to the file."""
    interned: dict[int, int] = {}
    requests: list[Request] = []
    for index, (where, item) in enumerate(records):
        input_tokens = req_int(where, item, "input_length", positive=True)
        timestamp_ms = req_float(where, item, "timestamp")
        if requests and timestamp_ms / 1000.0 < requests[-1].t:
            problem = f"{item['timestamp']} goes back in time; Mooncake lines must be in time order"
            raise where.fail("timestamp", problem)
        requests.append(
            Request(
                index=index,
                t=timestamp_ms / 1000.0,
                input_tokens=input_tokens,
                output_tokens=req_int(where, item, "output_length"),
                hash_ids=_hash_ids(where, item.get("hash_ids"), input_tokens, block_size, interned, partial_last=True),
                think_time=0.0,
            )
        )
    return Session(
        id=_stem(path),
        block_size=block_size,
        models=(),
        requests=tuple(requests),
        subagents=(),
        source=str(path),
        hash_id_scope="global",
    )


# ---- field readers ----------------------------------------------------------------------------


def _hash_ids(
    where: Where, value: Any, input_tokens: int, block_size: int, interned: dict[int, int], partial_last: bool
) -> tuple[int, ...]:
    """Validate and intern hash ids (one id per full block; Mooncake may also name the last partial one)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise where.fail("hash_ids", f"expected a list of integers, got {type(value).__name__}")
    full_blocks = input_tokens // block_size
    allowed = -(-input_tokens // block_size) if partial_last else full_blocks
    if len(value) > allowed:
        raise where.fail(
            "hash_ids",
            f"{len(value)} ids but the input ({input_tokens} tokens) has only {allowed} "
            f"{'' if partial_last else 'full '}blocks of {block_size}",
        )
    # Checked both ways, as Mooncake does: blocks without an id would be synthesized as fresh
    # tokens, so the replay would understate the prefix the trace shares.
    if len(value) < full_blocks:
        raise where.fail(
            "hash_ids",
            f"{len(value)} ids but the input ({input_tokens} tokens) has {full_blocks} full blocks "
            f"of {block_size}: one id per full block is needed",
        )
    # A Mooncake id for the trailing partial block names no full block: its tokens become tail.
    value = value[:full_blocks]
    before = len(interned)
    try:
        ids = tuple(map(interned.setdefault, value, value))
        # Only ids not seen before in this session need checking: the dict keeps insertion order.
        suspects = list(islice(reversed(interned), len(interned) - before))
    except TypeError:  # an unhashable entry (a list, an object)
        ids, suspects = (), value
    bad = next((v for v in suspects if type(v) is not int or not 0 <= v <= _MAX_HASH_ID), None)
    if bad is not None:
        raise where.fail("hash_ids", f"ids must be integers in [0, 2**63), found {bad!r}")
    return ids
