"""Worker processes (--workers N): shares merged exactly, the same plan whatever N, sizing."""

from __future__ import annotations

import time

from hdrh.histogram import HdrHistogram

from loadgen.results.metric_registry import METRIC_BY_NAME
from loadgen.results.metrics import SIGNIFICANT_DIGITS
from loadgen.run import workers
from loadgen.run.level import LevelLoad
from loadgen.run.workers import TOKENS_PER_S_PER_CORE, auto_workers


def _plan(records: list[dict]) -> dict[int, tuple]:
    """play -> (session, its first turn, the salt seen in its first request id's play)."""
    first = {}
    for rec in sorted(records, key=lambda r: r["start_ns"]):
        first.setdefault(rec["play"], (rec["session"], rec["turn"]))
    return first


def test_two_workers_merge_into_one_exact_level(start_server, sessions, replay):
    server = start_server(first_ms=3, itl_ms=1, kernel_compiles=1)
    folder = sessions(*({"n_requests": 8, "think": 0.01, "n_out": 4} for _ in range(5)))
    before = time.time()
    code, doc, records = replay(server.url, "--traces", str(folder), "--conc", "4", "--duration", "1",
                                "--warmup", "2req", "--workers", "2")
    assert code == 0
    level = doc["levels"][0]
    counted = [r for r in records if r["counted"]]
    # every request the server saw is in the one per-request file, counted or warm-up
    assert len(server.records()["records"]) == len(records)
    assert len(counted) == level["counts"]["requests_ok"] == level["metrics"]["ttft"]["stats"]["count"] > 0
    assert level["counts"]["warmup_requests_ok"] == len(records) - len(counted) >= 8  # 2 per lane, at least
    assert level["counts"]["max_active_trees"] == 4 and 0.9 <= level["window_s"] <= 1.1
    # the window on the wall clock: after the run began, and closed before it ended
    assert before < level["window_start_unix"] < time.time() - level["window_s"]
    assert 0.8 < level["counts"]["mean_inflight_requests"] <= 4  # both shares' time in flight, summed
    # one worker scrapes the server for both (1 per finished request): the scrape at window start
    # lands a few ms after the window opens, so nearly every counted request, and never more than all
    assert 0.5 * level["counts"]["requests_ok"] <= level["counts"]["server_kernel_compiles"] <= len(records)
    assert {r["id"].rsplit("-", 1)[1].split(".")[0] for r in records} == {"0", "1"}  # both workers sent
    # the merged histogram holds exactly the requests of both workers
    ttft = HdrHistogram(1, METRIC_BY_NAME["ttft"].highest, SIGNIFICANT_DIGITS)
    for rec in counted:
        ttft.record_value((rec["first_ns"] - rec["start_ns"]) // 1000)
    stats = level["metrics"]["ttft"]["stats"]
    assert stats["max"] == ttft.get_max_value() and stats["p50"] == ttft.get_value_at_percentile(50)
    assert level["metrics"]["itl"]["stats"]["count"] == sum(len(r["chunk_ns"]) - 1 for r in counted)
    assert sorted(level["requests"]["ttft_us"]) == sorted((r["first_ns"] - r["start_ns"]) // 1000 for r in counted)


def test_same_seed_same_plan_whatever_the_worker_count(start_server, sessions, replay):
    server = start_server(keep_prompts=True)
    folder = sessions(*({"n_requests": 10, "think": 0.0, "n_out": 2} for _ in range(5)))
    plans, prompts = [], []
    for count in ("1", "3"):
        _, _, records = replay(server.url, "--traces", str(folder), "--conc", "3", "--duration", "0.4",
                               "--seed", "7", "--workers", count, "--vocab-size", "50000")
        plans.append(_plan(records))
        seen = {r["id"]: r["prompt"][:64] for r in server.records()["records"]}
        prompts.append({r["play"]: seen[r["id"]] for r in records})
    shared = set(plans[0]) & set(plans[1])
    assert len(shared) >= 3
    assert all(plans[0][p] == plans[1][p] for p in shared)  # same session and start offset per play
    assert all(prompts[0][p] == prompts[1][p] for p in shared)  # same salt: the same prompt tokens


def test_open_loop_arrivals_do_not_depend_on_the_worker_count(start_server, sessions, replay):
    server = start_server()
    folder = sessions(*({"n_requests": 40, "think": 0.0, "n_out": 1} for _ in range(2)))
    runs = []
    for count in ("1", "2"):
        _, _, records = replay(server.url, "--traces", str(folder), "--rate", "60", "--duration", "0.6",
                               "--seed", "3", "--workers", count)
        records.sort(key=lambda r: r["due_ns"])
        t0 = records[0]["due_ns"]
        runs.append([(r["session"], r["turn"], r["play"], (r["due_ns"] - t0) / 1e6) for r in records][:25])
    assert [r[:3] for r in runs[0]] == [r[:3] for r in runs[1]], runs
    # the same arrival times: each worker maps the common start from wall to its own monotonic
    # clock, which may differ by a fraction of a millisecond
    assert all(abs(a[3] - b[3]) < 1.0 for a, b in zip(*runs)), runs


def test_the_wall_to_monotonic_map_skips_a_clock_pair_split_by_a_stall(monkeypatch):
    # wall reads around each perf read: the first pair straddles a 5 ms stall, the second is tight
    walls = iter([1_000_000, 6_000_000, 10_000_000, 10_000_400] + [20_000_000, 20_100_000] * 3)
    perfs = iter([500_000, 9_000_200] + [19_000_000] * 3)
    monkeypatch.setattr(workers.time, "time_ns", lambda: next(walls))
    monkeypatch.setattr(workers.time, "perf_counter_ns", lambda: next(perfs))
    # the tight pair: perf 9,000,200 at wall 10,000,200, so wall 12,000,000 is perf 11,000,000
    assert workers.mono_from_wall(12_000_000) == 11_000_000


def test_auto_workers_follow_the_load():
    closed = [LevelLoad("closed", concurrency=1), LevelLoad("closed", concurrency=16)]
    assert auto_workers(closed, 100.0, cpus=8) == 1
    heavy = TOKENS_PER_S_PER_CORE * 3 // 100  # streams of 100 tok/s that fill three cores
    assert auto_workers([LevelLoad("closed", concurrency=heavy)], 100.0, cpus=8) == 3
    assert auto_workers([LevelLoad("closed", concurrency=heavy)], 100.0, cpus=2) == 2
    assert auto_workers([LevelLoad("poisson", rate=TOKENS_PER_S_PER_CORE / 50)], 100.0, cpus=8) == 2


def test_bad_worker_count_is_named(replay_cli_error):
    code, err = replay_cli_error("--url", "http://127.0.0.1:9", "--workers", "0")
    assert code == 2 and "--workers" in err


def test_ctrl_c_stops_every_worker_and_keeps_what_they_measured(start_server, sessions, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from loadgen.results.file import read_results

    server = start_server(first_ms=3, itl_ms=1)
    folder = sessions(*({"n_requests": 8, "think": 0.01, "n_out": 4} for _ in range(4)))
    out = tmp_path / "out"
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "loadgen.cli", "replay", "--url", server.url, "--traces",
                             str(folder), "--conc", "4", "--duration", "60", "--workers", "2", "--out", str(out)],
                            cwd=repo, env=dict(os.environ, PYTHONPATH=str(repo)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("client: 2 worker processes")
        assert proc.stdout.readline().startswith("-- conc 4")
        import time

        time.sleep(1.5)  # inside the window
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    doc = read_results(out / "result.json")
    assert doc["status"] == "interrupted" and doc["levels"][0]["counts"]["requests_ok"] > 0
