"""Open loop: Poisson arrivals and Mooncake timestamps, latency from the intended send time."""

from __future__ import annotations

import json
import statistics


def test_a_slow_server_shows_its_queue_in_the_latency(start_server, sessions, replay):
    # Serves one request at a time, 100 ms each: at 20 requests/s the queue grows all along.
    server = start_server(first_ms=100, serial=True)
    folder = sessions(*({"n_requests": 30, "think": 0.0, "n_out": 1} for _ in range(2)))
    code, doc, records = replay(server.url, "--traces", str(folder), "--rate", "20", "--duration", "1.5",
                                "--max-error-rate", "1", "--timeout", "30")
    level = doc["levels"][0]
    assert level["mode"] == "poisson" and level["rate"] == 20
    counted = [r for r in records if r["counted"]]
    assert len(counted) == level["counts"]["requests_ok"] >= 10
    for rec in counted:
        # TTFT counts from the intended time; the client never sends before it
        assert rec["start_ns"] >= rec["due_ns"]
    ttft = level["metrics"]["ttft"]["stats"]
    assert ttft["p90"] > 500_000  # >> the server's own 100 ms: the queue is visible
    last = max(counted, key=lambda r: r["due_ns"])
    assert (last["first_ns"] - last["due_ns"]) // 1000 == max(level["requests"]["ttft_us"])
    queue = level["metrics"]["queue_delay"]["stats"]
    assert queue["count"] == level["counts"]["requests_ok"]


def test_poisson_arrivals_are_seeded_and_spaced_by_the_rate(start_server, sessions, replay):
    server = start_server()
    folder = sessions(*({"n_requests": 40, "think": 0.0, "n_out": 1} for _ in range(2)))
    dues = []
    for _ in range(2):
        _, _, records = replay(server.url, "--traces", str(folder), "--rate", "100", "--duration", "1",
                               "--seed", "3")
        times = sorted(r["due_ns"] for r in records)
        dues.append([t - times[0] for t in times])
    assert dues[0][:50] == dues[1][:50]
    gaps = [b - a for a, b in zip(dues[0], dues[0][1:])]
    assert 50 <= len(gaps) <= 200  # about 100 in one second
    assert 0.005e9 < statistics.mean(gaps) < 0.02e9


def test_mooncake_replays_recorded_timestamps_scaled(start_server, tmp_path, replay):
    server = start_server()
    trace = tmp_path / "mooncake.jsonl"
    stamps = [0, 100, 250, 400, 700]
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": 600 + t, "output_length": 3,
                                         "hash_ids": [1, 2 + t]}) + "\n" for t in stamps))
    code, doc, records = replay(server.url, "--traces", str(trace), "--time-scale", "2", "--duration", "5")
    assert code == 0
    assert doc["config"]["mode"] == "mooncake" and doc["levels"][0]["mode"] == "mooncake"
    records.sort(key=lambda r: r["due_ns"])
    offsets = [(r["due_ns"] - records[0]["due_ns"]) / 1e6 for r in records]
    assert offsets == [2 * t for t in stamps]
    assert [r["isl"] for r in records] == [600 + t for t in stamps]
    seen = {r["id"]: r for r in server.records()["records"]}
    assert all(seen[r["id"]]["n_prompt"] == r["isl"] for r in records)
    assert doc["levels"][0]["counts"]["requests_ok"] == 5


def test_a_directory_of_mooncake_files_is_refused(start_server, tmp_path, capsys):
    """Each Mooncake file is one timeline: replaying only one of several would silently drop the rest."""
    from loadgen.cli import main

    server = start_server()
    folder = tmp_path / "mooncake"
    folder.mkdir()
    for name in ("a", "b"):
        (folder / f"{name}.jsonl").write_text(json.dumps(
            {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1]}) + "\n")
    code = main(["replay", "--url", server.url, "--traces", str(folder), "--trace-format", "mooncake",
                 "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 2
    assert "a Mooncake replay takes one file" in capsys.readouterr().err
