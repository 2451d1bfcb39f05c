"""Readers: every format, auto-detection and forcing, the shared corpus, and malformed input."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from traces import DEFAULT_SET, TraceError, bundled_sets, load_traces
from traces.readers import DATA_DIR

SHARED_DIR = Path("/work/shared/traces/agentic-coding")

MOONCAKE_LINES = [
    {"timestamp": 0, "input_length": 1100, "output_length": 52, "hash_ids": [46, 47, 2353]},
    {"timestamp": 27482, "input_length": 1030, "output_length": 7, "hash_ids": [46, 47]},
    {"timestamp": 27482, "input_length": 600, "output_length": 1},
]


def test_session_file_fields_and_subagent_structure(session_file: Path) -> None:
    ts = load_traces(session_file)
    assert (ts.name, ts.format, ts.block_size) == ("tiny", "sessions", 4)
    (s,) = ts.sessions
    assert (s.id, s.models, s.tool_tokens, s.system_tokens, s.hash_id_scope) == ("tiny", ("m-big",), 7, 3, "local")
    assert [r.index for r in s.requests] == [0, 3, 4]
    assert [r.t for r in s.requests] == [0.0, 5.0, 10.0]
    first = s.requests[0]
    assert (first.input_tokens, first.output_tokens, first.hash_ids) == (10, 5, (1, 2))
    assert first.thinking and not s.requests[1].thinking
    assert (first.kind, first.stop, first.model, first.api_time, first.ttft) == ("n", "tool_use", "m-big", 2.0, None)
    (sub,) = s.subagents
    assert (sub.agent_id, sub.subagent_type, sub.t, sub.after_request) == ("agent_001", "Explore", 3.0, 1)
    assert (sub.duration_ms, sub.total_tokens, sub.tool_use_count, sub.status, sub.models) == (
        4000.0, 27, 1, "completed", ("m-small",))
    assert [r.index for r in sub.requests] == [1, 2]
    assert sub.requests[0].kind == "s" and sub.requests[0].ttft == 0.5
    assert [r.index for r in s.all_requests()] == [0, 1, 2, 3, 4]


def test_gzip_directory_and_session_jsonl_give_the_same_sessions(tmp_path: Path, files, session_file: Path) -> None:
    plain = load_traces(session_file).sessions[0]
    folder = tmp_path / "dir"
    folder.mkdir()
    files.json("dir/a.json.gz", files.session("a"), gz=True)
    files.json("dir/b.json", files.session("b"))
    (folder / "notes.txt").write_text("not a trace")
    from_dir = load_traces(folder)
    assert from_dir.name == "dir" and [s.id for s in from_dir.sessions] == ["a", "b"]
    jsonl = load_traces(files.jsonl("many.jsonl", [files.session("x"), files.session("y")]))
    assert [s.id for s in jsonl.sessions] == ["x", "y"]
    for s in (*from_dir.sessions, *jsonl.sessions):
        assert s.requests == plain.requests and s.subagents == plain.subagents


def test_json_array_of_sessions_and_duplicate_ids(files) -> None:
    ts = load_traces(files.json("arr.json", [files.session("p"), files.session("q")]))
    assert [s.id for s in ts.sessions] == ["p", "q"] and ts.sessions[1].source.endswith("arr.json:[1]")
    with pytest.raises(TraceError, match=r"line 2: session id 'p' is already used by .*line 1"):
        load_traces(files.jsonl("dup.jsonl", [files.session("p"), files.session("p")]))


def test_missing_optional_fields_get_defaults(files) -> None:
    doc = {"requests": [{"in": 70, "out": 3}, {"in": 130, "out": 1, "t": 4, "hash_ids": None,
                                                "think_time": None, "type": None}]}
    (s,) = load_traces(files.json("bare.json", doc)).sessions
    assert (s.id, s.block_size, s.models, s.subagents) == ("bare", 64, (), ())
    a, b = s.requests
    assert (a.t, a.think_time, a.hash_ids, a.kind, a.api_time, a.output_types) == (0.0, 0.0, (), "n", None, ())
    assert (b.t, b.think_time, b.hash_ids) == (4.0, 0.0, ())


def test_mooncake_auto_and_forced(files) -> None:
    path = files.jsonl("mc.jsonl", MOONCAKE_LINES)
    for fmt in ("auto", "mooncake"):
        ts = load_traces(path, fmt=fmt)
        assert (ts.name, ts.format, ts.block_size, len(ts.sessions)) == ("mc", "mooncake", 512, 1)
        reqs = ts.sessions[0].requests
        assert [r.t for r in reqs] == [0.0, 27.482, 27.482]
        assert [r.index for r in reqs] == [0, 1, 2]
        # 1100 tokens hold two full 512-blocks: the id of the trailing partial block is dropped.
        assert [r.hash_ids for r in reqs] == [(46, 47), (46, 47), ()]
        assert all(r.think_time == 0.0 for r in reqs)
        assert ts.sessions[0].hash_id_scope == "global"
    # Read with 256-token blocks, the 1100 tokens hold four full blocks: three ids are too few.
    with pytest.raises(TraceError, match=r"line 1: field 'hash_ids': 3 ids .* has 4 full blocks of 256"):
        load_traces(path, block_size=256)
    lines = [{**MOONCAKE_LINES[0], "hash_ids": [46, 47, 2353, 9]}]
    assert load_traces(files.jsonl("mc256.jsonl", lines), block_size=256).sessions[0].requests[0].hash_ids == (
        46, 47, 2353, 9)


def test_forcing_the_wrong_format_names_the_missing_field(files, session_file: Path) -> None:
    with pytest.raises(TraceError, match=r"tiny\.json: field 'input_length': missing"):
        load_traces(session_file, fmt="mooncake")
    with pytest.raises(TraceError, match=r"mc\.jsonl:line 1: field 'requests': missing"):
        load_traces(files.jsonl("mc.jsonl", MOONCAKE_LINES), fmt="sessions")


def test_bundled_set_requirements() -> None:
    assert DEFAULT_SET in bundled_sets()
    ts = load_traces(DEFAULT_SET)
    assert ts.name == DEFAULT_SET and ts.format == "sessions" and ts.block_size == 64
    assert len(ts.sessions) >= 20
    with_subagents = [s for s in ts.sessions if s.subagents]
    assert len(with_subagents) == 7
    lengths = sorted(len(s.requests) for s in ts.sessions)
    assert lengths[0] <= 10 and lengths[-1] >= 200
    folder = DATA_DIR / DEFAULT_SET
    assert "Apache License" in (folder / "LICENSE").read_text()
    assert "callanjfox/kv-cache-tester" in (folder / "NOTICE.md").read_text()
    assert sum(p.stat().st_size for p in folder.iterdir()) < 1_500_000


def test_bundled_files_are_unmodified_copies() -> None:
    if not SHARED_DIR.is_dir():
        pytest.skip("shared development set not present")
    for path in (DATA_DIR / DEFAULT_SET).glob("*.json.gz"):
        assert path.read_bytes() == (SHARED_DIR / path.name).read_bytes()


def test_every_shared_file_loads() -> None:
    if not SHARED_DIR.is_dir():
        pytest.skip("shared development set not present")
    assert len(list(SHARED_DIR.glob("*.json.gz"))) == 65
    ts = load_traces(SHARED_DIR)
    assert len(ts.sessions) == 65
    assert sum(len(s.subagents) for s in ts.sessions) == 18
    assert sum(1 for s in ts.sessions if s.subagents) == 7
    for s in ts.sessions:
        indexes = [r.index for r in s.all_requests()]
        assert indexes == list(range(len(indexes)))
        for r in s.all_requests():
            assert len(r.hash_ids) == r.input_tokens // 64


# ---- malformed input ---------------------------------------------------------------------------


def _broken(files, change) -> Path:
    doc = files.session()
    change(doc)
    return files.json("broken.json", doc)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d["requests"][2].pop("in"), r"broken\.json: requests\[2\]: field 'in': missing"),
        (lambda d: d["requests"][1]["requests"][1].pop("out"),
         r"requests\[1\]\.requests\[1\]: field 'out': missing"),
        (lambda d: d["requests"][3].update({"in": -5}), r"requests\[3\]: field 'in': must not be negative"),
        (lambda d: d["requests"][0].update({"out": "many"}), r"requests\[0\]: field 'out': expected an integer"),
        (lambda d: d["requests"][0].update({"hash_ids": [1, 2, 3]}),
         r"requests\[0\]: field 'hash_ids': 3 ids but the input \(10 tokens\) has only 2 full blocks of 4"),
        (lambda d: d["requests"][1]["requests"][0].update({"hash_ids": [1, "x"]}),
         r"requests\[1\]\.requests\[0\]: field 'hash_ids': ids must be integers"),
        (lambda d: d["requests"][0].update({"hash_ids": [1, -2]}), r"field 'hash_ids': ids must be integers"),
        (lambda d: d["requests"][0].update({"think_time": -1}), r"field 'think_time': must not be negative"),
        (lambda d: d["requests"][0].update({"type": "zzz"}), r"field 'type': unknown request type"),
        (lambda d: d["requests"][1]["requests"].append(copy.deepcopy(d["requests"][1])),
         r"requests\[1\]\.requests\[2\]: field 'type': a subagent inside a subagent"),
        (lambda d: d.pop("requests"), r"broken\.json: unknown trace format"),
        (lambda d: d.update({"requests": []}), r"field 'requests': empty"),
        (lambda d: d.update({"requests": [{"type": "subagent", "agent_id": "a", "requests": []}]}),
         r"broken\.json: field 'requests': the session has no request: no parent request, and its only item is a "
         r"subagent with no requests of its own"),
        (lambda d: d.update({"requests": [{"type": "subagent"}, {"type": "subagent", "requests": None}]}),
         r"broken\.json: field 'requests': the session has no request: no parent request, and its 2 items are "
         r"subagents with no requests"),
        (lambda d: d.update({"block_size": 0}), r"field 'block_size': must be positive"),
        (lambda d: d["requests"].insert(0, 7), r"requests\[0\]: expected a JSON object, got int"),
        # out of range (the same check in `traces stats` and replay: both read through load_traces)
        (lambda d: d["requests"][0].update({"think_time": 1e308}), r"field 'think_time': must be at most 1e\+12"),
        (lambda d: d["requests"][1].update({"t": 1e308}), r"field 't': must be at most 1e\+12"),
        (lambda d: d["requests"][0].update({"in": 0}), r"requests\[0\]: field 'in': must be positive, got 0"),
        (lambda d: d["requests"][0].update({"in": 1e30}), r"field 'in': must be at most 1,000,000,000, got 1e\+30"),
        (lambda d: d["requests"][0].update({"out": 1e12}), r"field 'out': must be at most 1,000,000,000"),
        (lambda d: d.update({"block_size": 10**18}), r"field 'block_size': must be at most"),
        (lambda d: d.update({"block_size": 1 << 20}), r"field 'block_size': must be at most 65,536 tokens per hash id"),
    ],
)
def test_malformed_sessions_name_file_path_and_field(files, change, expected: str) -> None:
    with pytest.raises(TraceError, match=expected):
        load_traces(_broken(files, change))


def test_malformed_mooncake_lines(files) -> None:
    lines = copy.deepcopy(MOONCAKE_LINES)
    lines[1]["output_length"] = -1
    with pytest.raises(TraceError, match=r"mc\.jsonl:line 2: field 'output_length': must not be negative"):
        load_traces(files.jsonl("mc.jsonl", lines))
    lines = copy.deepcopy(MOONCAKE_LINES)
    lines[0]["hash_ids"] = [1, 2, 3, 4]
    with pytest.raises(TraceError, match=r"line 1: field 'hash_ids': 4 ids but the input \(1100 tokens\) has only 3 b"):
        load_traces(files.jsonl("mc.jsonl", lines))
    lines = copy.deepcopy(MOONCAKE_LINES)
    lines[2]["timestamp"] = 10
    with pytest.raises(TraceError, match=r"line 3: field 'timestamp': 10 goes back in time"):
        load_traces(files.jsonl("mc.jsonl", lines))


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d["requests"][0].update({"hash_ids": [1]}),
         r"broken\.json: requests\[0\]: field 'hash_ids': 1 ids but the input \(10 tokens\) has 2 full blocks of 4"),
        (lambda d: d["requests"][1]["requests"][1].update({"hash_ids": [1, 2]}),
         r"broken\.json: requests\[1\]\.requests\[1\]: field 'hash_ids': 2 ids but the input \(13 tokens\) has 3 full"),
        (lambda d: d["requests"][3].update({"hash_ids": []}),
         r"broken\.json: requests\[3\]: field 'hash_ids': 0 ids but the input \(12 tokens\) has 3 full blocks"),
    ],
)
def test_hash_ids_shorter_than_the_full_blocks_are_refused(files, change, expected: str) -> None:
    with pytest.raises(TraceError, match=expected):
        load_traces(_broken(files, change))


def test_mooncake_hash_ids_may_omit_only_the_partial_block(files) -> None:
    lines = copy.deepcopy(MOONCAKE_LINES)
    lines[0]["hash_ids"] = [46]  # 1100 tokens: two full 512-blocks need two ids
    with pytest.raises(TraceError, match=r"mc\.jsonl:line 1: field 'hash_ids': 1 ids but the input \(1100 tokens\) "
                                         r"has 2 full blocks of 512"):
        load_traces(files.jsonl("mc.jsonl", lines))
    lines[0]["hash_ids"] = [46, 47]  # the id of the trailing partial block is optional
    assert load_traces(files.jsonl("ok.jsonl", lines)).sessions[0].requests[0].hash_ids == (46, 47)


def test_bad_json_empty_file_unknown_format_and_missing_path(tmp_path: Path, files) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"requests": [{"in": 3,')
    with pytest.raises(TraceError, match=r"bad\.json: invalid JSON"):
        load_traces(bad)
    lines = tmp_path / "bad.jsonl"
    lines.write_text('{"input_length": 5, "output_length": 1, "timestamp": 0}\n{oops\n')
    with pytest.raises(TraceError, match=r"bad\.jsonl:line 2: invalid JSON"):
        load_traces(lines)
    empty = tmp_path / "empty.json"
    empty.write_text("  \n")
    with pytest.raises(TraceError, match=r"empty\.json: empty file"):
        load_traces(empty)
    odd = files.json("odd.json", {"prompt": "hi"})
    with pytest.raises(TraceError, match=r"odd\.json: unknown trace format.*fields: prompt"):
        load_traces(odd)
    with pytest.raises(TraceError, match=r"nowhere\.json: no such file, directory or bundled trace set"):
        load_traces(tmp_path / "nowhere.json")
    with pytest.raises(TraceError, match=r"unknown trace format 'csv'"):
        load_traces(odd, fmt="csv")
    (tmp_path / "void").mkdir()
    with pytest.raises(TraceError, match=r"void: directory holds no trace files"):
        load_traces(tmp_path / "void")
    with pytest.raises(TraceError, match=r"the file says 4 but block_size=64"):
        load_traces(files.json("t.json", files.session()), block_size=64)


def test_wheel_ships_the_bundled_set_with_licence(tmp_path: Path) -> None:
    pytest.importorskip("setuptools", reason="building a wheel without isolation needs setuptools")
    root = Path(__file__).resolve().parents[2]
    project = tmp_path / "project"
    shutil.copytree(root / "traces", project / "traces", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, project / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(project)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    bundled = {f"traces/data/{DEFAULT_SET}/{p.name}" for p in (DATA_DIR / DEFAULT_SET).iterdir()}
    assert {f"traces/data/{DEFAULT_SET}/LICENSE", f"traces/data/{DEFAULT_SET}/NOTICE.md"} <= bundled
    assert bundled <= names


def test_subagent_start_is_recorded_end_minus_duration(tmp_path) -> None:
    """The corpus records a subagent's `t` when it finished; its start is t - duration_ms/1000,
    never before the parent request that launched it, and t itself when no duration is given."""
    import orjson

    from traces import load_traces

    session = {"id": "s", "block_size": 4, "requests": [
        {"t": 10.0, "type": "n", "in": 4, "out": 1, "hash_ids": [1], "api_time": 1.0},
        {"t": 20.0, "type": "subagent", "agent_id": "a", "duration_ms": 8500, "requests": []},
        {"t": 12.0, "type": "subagent", "agent_id": "b", "duration_ms": 9000, "requests": []},
        {"t": 15.0, "type": "subagent", "agent_id": "c", "requests": []},
    ]}
    path = tmp_path / "s.json"
    path.write_bytes(orjson.dumps(session))
    starts = {sub.agent_id: sub.t for sub in load_traces(path).sessions[0].subagents}
    assert starts == {"a": 11.5, "b": 10.0, "c": 15.0}
