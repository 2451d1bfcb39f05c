"""The parsed-trace cache: bundled sets only, read back equal, bypassed for the user's files."""

from __future__ import annotations

import loadgen.trace_cache as trace_cache
from traces import DEFAULT_SET, load_traces


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


def test_an_unwritable_cache_only_costs_the_parse(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert trace_cache.load_traces_cached(DEFAULT_SET, "auto").sessions
