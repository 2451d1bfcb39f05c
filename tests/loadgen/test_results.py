"""Results files: HDR stats, encoding round trip, atomic write, validation errors."""

from __future__ import annotations

import copy

import orjson
import pytest

from loadgen.results.file import (
    SCHEMA,
    ResultsError,
    check_writable,
    read_results,
    save_results,
    validate_results,
    write_results,
)
from loadgen.results.metrics import LevelRecorder, decode_histogram, histogram_stats


def _level() -> dict:
    rec = LevelRecorder()
    for i in range(1, 101):
        base = 1_000_000_000 * i
        chunks = [base + 50_000_000 + 10_000_000 * k for k in range(8)]
        rec.record_latencies(50_000 + i, 120_000 + i, 8, chunks, [1] * 8)
    return {"concurrency": 4, "rate": None, "mode": "closed", "failed": False, "fail_reasons": [],
            "window_s": 10.0, "counts": {}, "throughput": {}, "cache": {},
            "metrics": rec.summary(),
            "requests": {name: [1, 2] for name in
                         ("play", "session", "turn", "isl", "osl", "ttft_us", "e2el_us", "tpot_us")}}


def _doc() -> dict:
    return {"schema": SCHEMA, "status": "complete", "message": None, "config": {"seed": 1},
            "levels": [_level()], "pareto": {}}


def test_stats_follow_the_recorded_values():
    metrics = _level()["metrics"]
    ttft = metrics["ttft"]["stats"]
    assert ttft["count"] == 100 and 50_000 <= ttft["p50"] <= 50_100 and ttft["max"] <= 50_100 * 1.001
    assert metrics["itl"]["stats"]["count"] == 700
    assert 9_990 <= metrics["itl"]["stats"]["p99"] <= 10_010
    tpot_p90 = metrics["tpot"]["stats"]["p90"]
    assert metrics["interactivity"]["stats"]["p90"] == pytest.approx(1e6 / tpot_p90, rel=1e-6)
    assert "slow tail" in metrics["interactivity"]["note"]


def test_histograms_round_trip_and_merge_exactly():
    metrics = _level()["metrics"]
    hist = decode_histogram(metrics["e2el"]["hdr"])
    assert histogram_stats(hist) == metrics["e2el"]["stats"]
    hist.add(decode_histogram(metrics["e2el"]["hdr"]))
    assert hist.get_total_count() == 200


def test_write_read_round_trip(tmp_path):
    path = write_results(tmp_path / "sub" / "result.json", _doc())
    assert read_results(path) == orjson.loads(orjson.dumps(_doc()))
    assert [p.name for p in path.parent.iterdir()] == ["result.json"]  # no temp file left


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(schema="other/9"), "schema"),
    (lambda d: d.update(status="meh"), "status"),
    (lambda d: d.pop("levels"), "levels"),
    (lambda d: d["levels"][0].pop("counts"), "levels[0].counts: missing"),
    (lambda d: d["levels"][0]["metrics"]["ttft"].update(hdr="not-hdr!"), "levels[0].metrics.ttft.hdr"),
    (lambda d: d["levels"][0]["metrics"]["itl"]["stats"].update(count=3), "metrics.itl.stats.count"),
    (lambda d: d["levels"][0]["requests"]["osl"].append(3), "columns differ"),
    (lambda d: d.update(launch=[]), "launch: expected an object"),
    (lambda d: d.update(launch={"load_argv": []}), "launch.server: missing"),
    (lambda d: d.update(launch={"server": {"argv": "server start"}}), "launch.server.argv: expected a list"),
])
def test_validation_names_the_field(mutate, message):
    doc = copy.deepcopy(_doc())
    mutate(doc)
    with pytest.raises(ResultsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate_results(doc, "run.json")


def test_unreadable_files_are_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ResultsError, match="bad.json: not valid JSON"):
        read_results(bad)
    with pytest.raises(ResultsError, match="missing.json: cannot read"):
        read_results(tmp_path / "missing.json")


def test_batched_recording_equals_one_value_at_a_time():
    import numpy as np

    from loadgen.results.metrics import new_histogram, record_many

    rng = np.random.default_rng(5)
    values = np.concatenate([rng.integers(0, 3000, 500), rng.lognormal(10, 3, 2000).astype(np.int64),
                             np.array([0, 1, 2047, 2048, 10**12])])
    one, many = new_histogram("itl"), new_histogram("itl")
    for v in values.tolist():
        one.record_value(min(v, one.highest_trackable_value))
    record_many(many, values)
    assert many.encode() == one.encode()
    assert histogram_stats(many) == histogram_stats(one)


def test_several_histograms_recorded_together_equal_one_value_at_a_time():
    import numpy as np
    from hdrh.histogram import HdrHistogram

    from loadgen.results.metrics import new_histogram, record_batches

    rng = np.random.default_rng(6)
    names = ("ttft", "interactivity", "tokens_per_chunk", "tpot")
    values = {"ttft": rng.lognormal(10, 3, 300).astype(np.int64).tolist() + [-5, 10**13],
              "interactivity": [10**12 + 1, 0, 3, 2048] + rng.integers(1, 10**9, 50).tolist(),
              "tokens_per_chunk": [1, 2, 10**8], "tpot": []}
    one = {name: new_histogram(name) for name in names}
    together = {name: new_histogram(name) for name in names}
    for name in names:
        for v in values[name]:
            one[name].record_value(min(max(0, v), one[name].highest_trackable_value))
    record_batches([(together[name], list(values[name])) for name in names])
    for name in names:
        assert together[name].encode() == one[name].encode(), name
    with pytest.raises(ValueError, match="bucket layout"):
        record_batches([(new_histogram("ttft"), [1]), (HdrHistogram(1, 10**6, 2), [1])])


def test_loop_lags_recorded_in_batches_equal_one_at_a_time():
    """Lags wait for the recorder's next batch (and are bounded while none comes); a late wake-up
    reads as a negative lag and counts as 0, one past the histogram's range as its highest."""
    from loadgen.results.metrics import new_histogram

    lags = [-3, 0, 1, 999, 5_000, 12_345_678, 10**13] * 300  # more than LevelRecorder.LOOP_LAGS_KEPT
    rec, one = LevelRecorder(), new_histogram("loop_lag")
    for lag in lags:
        rec.record_loop_lag(lag)
        one.record_value(min(max(0, lag), one.highest_trackable_value))
    assert len(rec._pending["loop_lag"]) < rec.LOOP_LAGS_KEPT
    assert rec.encoded()["loop_lag"] == one.encode().decode("ascii")


def test_chunk_histograms_in_batches_equal_one_value_at_a_time():
    """ITL and tokens per chunk over batches that mix one-token streams (counted, not converted)
    with speculative ones, split at flush points anywhere, equal recording every value alone."""
    import random

    from loadgen.results.metrics import new_histogram

    rng = random.Random(3)
    rec, itl, per_chunk = LevelRecorder(), new_histogram("itl"), new_histogram("tokens_per_chunk")
    for i in range(3 * LevelRecorder.FLUSH_EVERY + 5):
        count = rng.randint(1, 12)
        tokens = [1] * count if i % 3 else [rng.choice((1, 1, 2, 3, 0)) for _ in range(count)]
        stamps = sorted(10**9 * i + rng.randint(0, 10**8) for _ in range(count))
        rec.record_latencies(50_000, 90_000, max(1, sum(tokens)), stamps, tokens)
        for earlier, later in zip(stamps, stamps[1:]):
            itl.record_value((later - earlier) // 1000)
        for n in tokens:
            per_chunk.record_value(n)
    encoded = rec.encoded()
    assert encoded["itl"] == itl.encode().decode("ascii")
    assert encoded["tokens_per_chunk"] == per_chunk.encode().decode("ascii")


def test_check_writable_names_the_flag_and_the_folder(tmp_path):
    check_writable(tmp_path / "new" / "deeper")
    assert not (tmp_path / "new").exists()  # the folders it made for the probe are gone again
    (tmp_path / "kept").mkdir()
    check_writable(tmp_path / "kept" / "run")
    assert (tmp_path / "kept").is_dir() and not (tmp_path / "kept" / "run").exists()
    with pytest.raises(ResultsError, match=r"^--out /proc/x: cannot write there: "):
        check_writable("/proc/x")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ResultsError, match=r"^--per-request .*file/sub: cannot write there: "):
        check_writable(blocker / "sub", "--per-request")


def test_save_results_falls_back_to_a_temporary_file(tmp_path, caplog):
    blocker = tmp_path / "was-a-folder"
    blocker.write_text("x")
    doc = _doc()
    assert save_results(tmp_path / "ok" / "result.json", doc) == tmp_path / "ok" / "result.json"
    with caplog.at_level("ERROR"):
        written = save_results(blocker / "result.json", doc)
    try:
        assert written.parent != blocker and written.name.startswith("agentload-result-")
        assert read_results(written) == orjson.loads(orjson.dumps(doc))
        assert f"cannot write results to {blocker / 'result.json'}" in caplog.text
        assert f"wrote them to {written} instead" in caplog.text
    finally:
        written.unlink()
