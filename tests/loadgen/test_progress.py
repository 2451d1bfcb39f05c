"""Live progress: what a level will do, status lines while it runs, and a bounded warm-up."""

from __future__ import annotations

import io
import time

from loadgen.results.file import read_results
from loadgen.run.progress import ProgressPrinter, describe


def _snap(**fields) -> dict:
    base = {"running": True, "window_open": False, "window_elapsed_s": 0.0, "stopping": False, "ok": 0,
            "warmup_ok": 0, "errors": 0, "inflight": 0, "output_tokens": 0, "slowest_inflight_s": 0.0,
            "lanes_warm": 0}
    return {**base, **fields}


def test_status_lines_name_the_phase_and_the_slowest_request():
    warm = describe("conc 16", _snap(warmup_ok=3, inflight=16, slowest_inflight_s=42.5), 61.0, 40, 1800, 600)
    assert warm.startswith("[conc 16] warm-up 61 s (limit 1800 s)") and "3 warm-up done" in warm
    assert "16 in flight" in warm and "slowest in flight 42.5 s" in warm
    window = describe("conc 16", _snap(window_open=True, window_elapsed_s=10.0, ok=20, output_tokens=5000,
                                       inflight=4, errors=1), 70.0, 40, 1800, 600)
    assert "window 10/40 s | 20 ok" in window and "500 out tok/s" in window and "1 errors" in window
    drain = describe("conc 16", _snap(window_open=True, window_elapsed_s=45.0, stopping=True, inflight=2,
                                      slowest_inflight_s=9.0), 105.0, 40, 1800, 600)
    assert drain.startswith("[conc 16] drain 5 s (limit 600 s)")


def test_piped_progress_is_one_line_every_interval_and_quiet_is_silent():
    stream = io.StringIO()
    printer = ProgressPrinter(0.05, stream=stream)
    deadline = time.monotonic() + 0.22
    while time.monotonic() < deadline:
        printer.show("status")
        time.sleep(0.01)
    lines = stream.getvalue().splitlines()
    assert 2 <= len(lines) <= 5 and set(lines) == {"status"} and "\r" not in stream.getvalue()
    quiet = io.StringIO()
    silent = ProgressPrinter(0.0, enabled=False, stream=quiet)
    silent.show("status")
    silent.say("table")
    assert quiet.getvalue() == ""


def test_each_level_says_what_it_will_do(start_server, sessions, tmp_path, capsys):
    from loadgen.cli import main

    server = start_server()
    folder = sessions(*({"n_requests": 4, "think": 0.0, "n_out": 2} for _ in range(3)))
    assert main(["replay", "--url", server.url, "--traces", str(folder), "--conc", "2", "--duration", "0.3",
                 "--warmup", "2req", "--out", str(tmp_path / "out")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("-- conc 2"))
    assert "2 lanes over 2 sessions" in line and "prompt tokens" in line and "window 0.3 s" in line


def test_a_warmup_that_outlasts_its_limit_stops_the_run_clearly(start_server, sessions, tmp_path, capsys):
    from loadgen.cli import main

    server = start_server(first_ms=5000)  # far slower than the warm-up may take
    folder = sessions({"n_requests": 4, "think": 0.0, "n_out": 2})
    out = tmp_path / "out"
    started = time.monotonic()
    code = main(["replay", "--url", server.url, "--traces", str(folder), "--warmup", "1req", "--duration", "1",
                 "--warmup-timeout", "0.5", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 1 and time.monotonic() - started < 4
    assert "--warmup-timeout 0.5 s" in captured.err and "raise --warmup-timeout" in captured.err
    assert "during the warm-up" in captured.out and "window 0.0 s" not in captured.out
    doc = read_results(out / "result.json")
    assert doc["status"] == "failed" and "--warmup-timeout" in doc["message"]
