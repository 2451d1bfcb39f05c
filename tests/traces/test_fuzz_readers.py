"""The trace readers under a seeded, bounded property-based fuzzer (hypothesis): session documents
and Mooncake lines of the right shape with hostile values (huge, negative, fractional and
non-finite numbers, integers past 64 bits, wrong types, missing fields, nested and empty
subagents, unicode and repeated ids, empty lists), in every container the readers take (a JSON
object or array, JSONL, gzip, a folder of files), cut short or replaced by arbitrary bytes.

Every file either loads into a TraceSet whose numbers lie within the reader's documented ranges
(traces/fields.py: MAX_COUNT, MAX_SECONDS, MAX_BLOCK) or raises a TraceError naming the file;
`loadgen traces stats` on it prints its table, or exits 2 with that one-line error, never a
traceback."""

from __future__ import annotations

import contextlib
import gzip
import io
import itertools
import json
import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen.cli import main
from traces import TraceError, TraceSet, load_traces
from traces.fields import MAX_BLOCK, MAX_COUNT, MAX_SECONDS
from traces.schema import MOONCAKE, Request

# Seeded and bounded: the same examples on every run, each within the deadline (a reader that is
# slow on some input fails here, not in a replay).
FUZZ = settings(max_examples=200, deadline=timedelta(seconds=5), derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

MISSING = object()  # a field left out of its record
HASH_ID_END = 2**63  # hash ids travel through int64 arrays
EDGES = (-1, -0.0, 0, 0.5, 1e-320, MAX_BLOCK + 1, 2**31, 2**53 + 1, 2**63, 2**64, 2**70, MAX_COUNT, MAX_COUNT + 1,
         MAX_SECONDS, MAX_SECONDS * 1.5, 1e300, -1e308, math.inf, math.nan)
junk = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.sampled_from(EDGES)
        | st.text(max_size=8) | st.lists(st.integers(-3, 3), max_size=3)
        | st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
ids = st.sampled_from(["s", "s#1", "a", "é", "\U0001f600", "agent_001"]) | st.text(max_size=8)
seconds = st.floats(0, 100) | st.integers(0, 100)
counts = st.integers(0, 50)
hash_id = st.integers(0, 20) | st.integers(0, HASH_ID_END - 1)


def _field(draw: Any, good: st.SearchStrategy, rate: int) -> Any:
    """A good value, or junk or MISSING in `rate` percent of fields."""
    return draw(good) if draw(st.integers(0, 99)) >= rate else draw(junk | st.just(MISSING))


def _record(fields: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value is not MISSING}


def _ids_for(draw: Any, tokens: Any, block: int, partial: bool, rate: int) -> Any:
    """hash_ids for `tokens` in blocks of `block`: the right count, else any list, junk or none."""
    full = tokens // block if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else 0
    most = -(-tokens // block) if partial and full else full
    right = st.lists(hash_id, min_size=full, max_size=most) if most <= 64 else st.just([])
    return _field(draw, right if draw(st.integers(0, 99)) >= rate else st.lists(hash_id | junk, max_size=6), rate)


@st.composite
def requests(draw: Any, block: int, rate: int) -> dict[str, Any]:
    tokens = _field(draw, st.integers(1, 40), rate)
    names = st.lists(st.sampled_from(["text", "thinking", "tool_use"]) | st.text(max_size=4), max_size=3)
    return _record({
        "in": tokens, "out": _field(draw, counts, rate), "t": _field(draw, seconds, rate),
        "think_time": _field(draw, seconds, rate), "api_time": _field(draw, seconds, rate),
        "ttft": _field(draw, seconds, rate), "type": _field(draw, st.sampled_from("ns"), rate),
        "hash_ids": _ids_for(draw, tokens, block, False, rate), "model": _field(draw, ids, rate),
        "input_types": _field(draw, names, rate), "output_types": _field(draw, names, rate),
        "stop": _field(draw, ids, rate)})


@st.composite
def subagents(draw: Any, block: int, rate: int, nested: bool) -> dict[str, Any]:
    nest = nested and draw(st.integers(0, 99)) < rate  # a subagent inside a subagent: refused
    inner = requests(block, rate) | subagents(block, rate, nested=False) if nest else requests(block, rate)
    return _record({
        "type": "subagent", "agent_id": _field(draw, ids, rate), "subagent_type": _field(draw, ids, rate),
        "t": _field(draw, seconds, rate), "duration_ms": _field(draw, st.floats(0, 1e5), rate),
        "total_tokens": _field(draw, counts, rate), "tool_use_count": _field(draw, counts, rate),
        "status": _field(draw, ids, rate), "models": _field(draw, st.lists(ids, max_size=2), rate),
        "requests": _field(draw, st.lists(inner, max_size=3), rate)})


@st.composite
def sessions(draw: Any, rate: int) -> dict[str, Any]:
    stated = _field(draw, st.integers(1, 8) | st.sampled_from([64, MAX_BLOCK]), rate)
    block = stated if isinstance(stated, int) and not isinstance(stated, bool) and 0 < stated <= MAX_BLOCK else 64
    # parents' requests with subagents among them (some empty, some holding a subagent), or subagents only
    items = (st.lists(requests(block, rate) | requests(block, rate) | subagents(block, rate, nested=True),
                      min_size=1 if draw(st.integers(0, 99)) >= rate else 0, max_size=5)
             | st.lists(subagents(block, rate, nested=True), min_size=1, max_size=2))
    return _record({
        "id": _field(draw, ids, rate), "block_size": stated, "models": _field(draw, st.lists(ids, max_size=2), rate),
        "requests": _field(draw, items, rate), "tool_tokens": _field(draw, counts, rate),
        "system_tokens": _field(draw, counts, rate),
        "hash_id_scope": _field(draw, st.sampled_from(["local", "global"]), rate)})


@st.composite
def mooncake_lines(draw: Any, rate: int) -> list[dict[str, Any]]:
    """Lines in time order, or not."""
    gaps = draw(st.lists(st.integers(0, 5000) | st.floats(0, 5000), min_size=1, max_size=5))
    ordered = draw(st.integers(0, 99)) >= rate
    clock, lines = 0.0, []
    for gap in gaps:
        clock = clock + gap if ordered else gap
        tokens = _field(draw, st.integers(1, 3000), rate)
        lines.append(_record({"timestamp": _field(draw, st.just(clock), rate), "input_length": tokens,
                              "output_length": _field(draw, counts, rate),
                              "hash_ids": _ids_for(draw, tokens, 512, True, rate)}))
    return lines


def _dumps(document: Any) -> bytes:
    # the stdlib's writer: integers past 64 bits as digits, NaN and Infinity as bare words
    return json.dumps(document, ensure_ascii=False).encode()


@st.composite
def trace_files(draw: Any) -> list[tuple[str, bytes]]:
    """The files of one trace source: (name, content); more than one makes a folder."""
    # the percentage of fields that are junk or left out: from none (files that load) to most
    rate = draw(st.sampled_from([0, 0, 1, 5, 20, 60]))
    records = draw(st.lists(sessions(rate), min_size=1, max_size=3) | mooncake_lines(rate))
    container = draw(st.sampled_from(["object", "array", "jsonl", "gzip", "folder", "cut", "bytes"]))
    if container == "object":
        return [("t.json", _dumps(records[0]))]
    if container == "array":
        return [("t.json", _dumps(records))]
    lines = b"\n".join(map(_dumps, records)) + b"\n"
    if container == "jsonl":
        return [("t.jsonl", lines)]
    if container == "gzip":
        return [("t.jsonl.gz", gzip.compress(lines))]
    if container == "folder":
        return [(f"{n}.jsonl", _dumps(record)) for n, record in enumerate(records)]
    if container == "cut":
        whole = draw(st.sampled_from([lines, gzip.compress(lines)]))
        return [("t.jsonl", whole[: draw(st.integers(0, len(whole)))])]
    return [("t.json", draw(st.binary(max_size=64)))]


_numbers = itertools.count()


def _write(root: Path, files: list[tuple[str, bytes]]) -> Path:
    """The files in a fresh folder; the path to load (the file, or the folder of several)."""
    folder = root / f"case{next(_numbers)}"
    folder.mkdir()
    for name, content in files:
        (folder / name).write_bytes(content)
    return folder if len(files) > 1 else folder / files[0][0]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _load(path: Path) -> TraceSet | None:
    """The set, or None after a TraceError that names the file."""
    try:
        return load_traces(path)
    except TraceError as exc:
        assert str(path) in str(exc), str(exc)
        return None


def _in_range(request: Request, block: int) -> None:
    assert 1 <= request.input_tokens <= MAX_COUNT and 0 <= request.output_tokens <= MAX_COUNT
    for value in (request.t, request.think_time, request.api_time, request.ttft):
        assert value is None or (isinstance(value, float) and 0.0 <= value <= MAX_SECONDS), value
    assert len(request.hash_ids) in (0, request.input_tokens // block)  # none: the field was left out
    assert all(type(i) is int and 0 <= i < HASH_ID_END for i in request.hash_ids)


def _check_ranges(traces: TraceSet) -> None:
    assert traces.sessions and 1 <= traces.block_size <= MAX_BLOCK
    assert len({s.id for s in traces.sessions}) == len(traces.sessions)
    for session in traces.sessions:
        every = list(session.all_requests())
        assert every, session  # a session that would send nothing is refused
        for request in every:
            _in_range(request, traces.block_size)
        if traces.format == MOONCAKE:
            assert [r.t for r in every] == sorted(r.t for r in every)
            continue
        assert [r.index for r in every] == list(range(len(every)))
        for count in (session.tool_tokens, session.system_tokens):
            assert count is None or 0 <= count <= MAX_COUNT
        for sub in session.subagents:
            assert 0.0 <= sub.t <= MAX_SECONDS and 0 <= sub.after_request <= len(session.requests)
            assert sub.duration_ms is None or 0.0 <= sub.duration_ms <= MAX_SECONDS
            for count in (sub.total_tokens, sub.tool_use_count):
                assert count is None or 0 <= count <= MAX_COUNT


@FUZZ
@given(files=trace_files())
def test_any_trace_file_loads_within_range_or_is_a_trace_error(root: Path, files: list[tuple[str, bytes]]) -> None:
    traces = _load(_write(root, files))
    if traces is not None:
        _check_ranges(traces)


@settings(FUZZ, max_examples=100)
@given(files=trace_files())
def test_traces_stats_prints_its_table_or_exits_2_naming_the_file(root: Path,
                                                                   files: list[tuple[str, bytes]]) -> None:
    path = _write(root, files)
    loads = _load(path) is not None
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["traces", "stats", str(path)])
    if loads:
        assert code == 0 and "prefix-cache hit rate" in out.getvalue(), err.getvalue()
    else:
        assert code == 2 and not out.getvalue()
        message = err.getvalue()
        assert message.startswith(f"loadgen traces: error: {path}") and message.count("\n") == 1, message
