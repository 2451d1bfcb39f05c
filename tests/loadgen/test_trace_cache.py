"""The parsed-trace cache: bundled sets only, read back equal, bypassed for the user's files."""

from __future__ import annotations

import pytest

import loadgen.run.trace_cache as trace_cache
from traces import DEFAULT_SET, load_traces


@pytest.fixture(autouse=True)
def _own_temporary_directory(tmp_path, monkeypatch):
    """The fallback cache folder lives in the temporary directory: a test's own, not the host's."""
    monkeypatch.setattr(trace_cache.tempfile, "tempdir", str(tmp_path / "tmp"))


def test_a_bundled_set_is_parsed_once_then_read_back_equal(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = trace_cache.load_traces_cached(DEFAULT_SET, "auto")
    assert len(list(trace_cache.cache_dir().glob(f"{DEFAULT_SET}-auto-*.pickle"))) == 1

    def no_parsing(*args, **kwargs):
        raise AssertionError("parsed again instead of read from the cache")

    monkeypatch.setattr(trace_cache, "load_traces", no_parsing)
    assert trace_cache.load_traces_cached(DEFAULT_SET, "auto") == first == load_traces(DEFAULT_SET, "auto")


def test_a_broken_entry_is_parsed_again_and_user_files_never_cached(tmp_path, monkeypatch, sessions):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    trace_cache.load_traces_cached(DEFAULT_SET, "auto")
    (entry,) = trace_cache.cache_dir().glob("*.pickle")
    entry.write_bytes(b"not a pickle")
    assert trace_cache.load_traces_cached(DEFAULT_SET, "auto") == load_traces(DEFAULT_SET, "auto")
    folder = sessions({"n_requests": 2, "think": 0.0})
    assert trace_cache.load_traces_cached(str(folder), "auto").sessions[0].id == "s0"
    assert len(list(trace_cache.cache_dir().glob("*.pickle"))) == 1


def test_an_unwritable_cache_folder_falls_back_to_the_temporary_directory(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    first = trace_cache.load_traces_cached(DEFAULT_SET, "auto")
    assert len(list((tmp_path / "tmp").glob("agentload*/traces/*.pickle"))) == 1

    def no_parsing(*args, **kwargs):
        raise AssertionError("parsed again instead of read from the cache")

    monkeypatch.setattr(trace_cache, "load_traces", no_parsing)
    assert trace_cache.load_traces_cached(DEFAULT_SET, "auto") == first


def test_the_entry_keeps_each_shared_run_of_hash_ids_once():
    """Requests that extend, shrink or leave an earlier one's ids, in the parent and a subagent,
    come back equal; the bundled set's entry is a fraction of its plain pickle."""
    import pickle

    from traces import Request, Session, Subagent, TraceSet

    def request(index: int, ids: tuple[int, ...]) -> Request:
        return Request(index, 0.0, 64 * len(ids) + 5, 3, ids, 0.0, model="m", input_types=("text",))

    grows = [request(0, (1, 2)), request(1, (1, 2, 3, 4)), request(3, (1, 2, 3)), request(4, (9,)), request(5, ())]
    sub = Subagent("a", "Explore", 0.5, 1, 10.0, 7, 1, "completed", (request(2, (1, 2, 70, 71)),))
    session = Session("s", 64, ("m",), tuple(grows), (sub,), "f.json", 10, 20, "local")
    small = TraceSet("t", "sessions", 64, (session, session))
    assert trace_cache.unpack(pickle.loads(pickle.dumps(trace_cache.pack(small)))) == small
    bundled = load_traces(DEFAULT_SET, "auto")
    entry = pickle.dumps(trace_cache.pack(bundled))
    assert trace_cache.unpack(pickle.loads(entry)) == bundled
    assert len(entry) * 5 < len(pickle.dumps(bundled))


def test_packed_traces_travel_to_a_worker_equal_and_small():
    """What a worker process receives (pickled WorkerSetup.traces) rebuilds the parent's set."""
    import pickle

    bundled = load_traces(DEFAULT_SET, "auto")
    packed = trace_cache.PackedTraces.of(bundled)
    travelled = pickle.loads(pickle.dumps(packed))
    assert travelled.unpack() == bundled
    assert len(pickle.dumps(packed)) * 5 < len(pickle.dumps(bundled))
