"""`loadgen bench` on the command line: help, engine flag errors, the same open-loop load through
the in-process transport and through `server start` + HTTP, an engine crash mid-run, and the
embedded default run with no arguments (the README's main job)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from loadgen.cli import main

pytestmark = pytest.mark.slow  # tens of seconds: scheduled first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ENGINE_FLAGS = ["--model", "tiny", "--device", "cpu", "--max-model-len", "2048", "--seed", "0"]
_READY = re.compile(r"ready at (http://\S+) ")


def test_help_lists_replay_and_engine_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--conc", "--rate", "--duration", "--warmup", "--traces", "--token-scale", "--out",
                 "--model", "--kv-cache-dtype", "--block-size", "--speculative-config", "--tp", "--seed"):
        assert flag in out
    assert "--url" not in out and "--api-key" not in out
    assert "tiny: --conc 1,2,4" in out  # the embedded defaults are printed


@pytest.mark.parametrize("flags, message", [
    (["--block-size", "24"], "--block-size: must be a positive multiple of 16"),
    (["--speculative-config", "{nope"], "--speculative-config: not valid JSON"),
    (["--max-model-len", "100000"], "--max-model-len: must be in 1..8192"),
    (["--kv-cache-gb", "0.0000001"], "--kv-cache-gb: leaves no room for a single KV block"),  # refused at build
    (["--conc", "0"], "--conc: expected positive numbers"),
])
def test_bad_flags_exit_2_naming_the_flag(tmp_path, flags, message):
    done = _bench(tmp_path / "out", "--device", "cpu", *flags)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "loadgen bench: error:" in done.stderr
    assert "Traceback" not in done.stderr


def _loadgen(*argv: str, prelude: str = "", cwd: Path = ROOT, timeout: float = 240) -> subprocess.CompletedProcess:
    """`loadgen ARGV...` in a fresh process (the engine sets process-wide torch threads), after `prelude`."""
    code = f"{prelude}\nimport sys\nfrom loadgen.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def _bench(out: Path, *flags: str, prelude: str = "") -> subprocess.CompletedProcess:
    return _loadgen("bench", "--out", str(out), "--quiet", *flags, prelude=prelude)


@pytest.fixture
def http_server(tmp_path):
    log = open(tmp_path / "server.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "start", "--port", "0", *ENGINE_FLAGS],
                            cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(1200):
            log.seek(0)
            match = _READY.search(log.read())
            if match or proc.poll() is not None:
                break
            subprocess.run(["sleep", "0.1"])
        assert match, f"server did not start:\n{(tmp_path / 'server.log').read_text()}"
        yield match.group(1)
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


def test_inprocess_and_http_agree_on_counts(sessions, http_server, replay, tmp_path):
    traces = sessions({"n_requests": 5, "think": 0.0}, {"n_requests": 4, "think": 0.0, "n_out": 12})
    # Open loop with a seeded Poisson plan and no warm-up: the requests due inside the window,
    # their input and output lengths are fixed by the seed, whatever the latencies.
    load = ["--traces", str(traces), "--rate", "3", "--duration", "4", "--warmup", "0s", "--seed", "0",
            "--token-scale", "1", "--think-time-scale", "1"]
    done = _bench(tmp_path / "inprocess", *load, *ENGINE_FLAGS)
    assert done.returncode == 0, done.stderr
    inproc = orjson.loads((tmp_path / "inprocess" / "result.json").read_bytes())
    code, http, _ = replay(http_server, *load)
    assert code == 0
    (a,), (b,) = inproc["levels"], http["levels"]
    for key in ("requests_ok", "input_tokens", "output_tokens", "output_tokens_counted", "errors_total"):
        assert a["counts"][key] == b["counts"][key], key
    assert a["counts"]["requests_ok"] >= 8 and a["counts"]["errors_total"] == 0
    assert a["counts"]["server_kernel_compiles"] == b["counts"]["server_kernel_compiles"] == 0  # CPU: no JIT
    for metric in ("ttft", "e2el"):
        ratio = a["metrics"][metric]["stats"]["p50"] / b["metrics"][metric]["stats"]["p50"]
        assert 0.1 < ratio < 10, (metric, ratio)  # the same order; the overhead is measured in benchmarks/
    config = inproc["config"]
    assert config["transport"] == "inprocess" and config["device"] == "cpu"
    assert config["engine"]["scheduler"]["max_model_len"] == 2048 and config["gpus"] == 1
    assert http["config"]["url"] == http_server


def test_engine_crash_ends_the_run_with_partial_results(sessions, tmp_path):
    traces = sessions({"n_requests": 30, "think": 0.05})
    # A fault planted in the real engine: its 40th step raises.
    prelude = ("import server.engine.core as core\n"
               "real_step, steps = core.Engine.step, []\n"
               "def failing_step(self):\n"
               "    steps.append(1)\n"
               "    if len(steps) == 40:\n"
               "        raise RuntimeError('planted fault at step 40')\n"
               "    return real_step(self)\n"
               "core.Engine.step = failing_step\n")
    done = _bench(tmp_path / "crash", "--traces", str(traces), "--conc", "1", "--duration", "30",
                  "--token-scale", "1", *ENGINE_FLAGS, prelude=prelude)
    assert done.returncode == 1, done.stderr
    assert "planted fault at step 40" in done.stderr and "loadgen bench: error:" in done.stderr
    doc = orjson.loads((tmp_path / "crash" / "result.json").read_bytes())
    assert doc["status"] == "server_dead" and "planted fault" in doc["message"]
    (level,) = doc["levels"]
    assert level["counts"]["requests_ok"] > 0 and level["counts"]["errors"].get("engine_dead") == 1


def test_default_run_writes_results_plots_and_html(tmp_path):
    """`loadgen bench` with no arguments, exactly as the README's quick start runs it."""
    done = _loadgen("bench", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    (folder,) = (tmp_path / "results").iterdir()
    doc = orjson.loads((folder / "result.json").read_bytes())
    assert doc["status"] == "complete"
    assert [level["concurrency"] for level in doc["levels"]] == [1, 2, 4]
    assert not any(level["failed"] for level in doc["levels"])
    assert doc["config"]["transport"] == "inprocess" and doc["config"]["model"] == "tiny"
    assert doc["config"]["traces"]["name"] == "agentic-coding"
    server = doc["launch"]["server"]  # the engine ran in this process: its launch is loadgen's own
    assert server["kind"] == "inprocess" and server["argv"] == doc["launch"]["load_argv"] and "bench" in server["argv"]
    assert server["versions"] == doc["launch"]["versions"] and "torch" in server["versions"]["packages"]
    for label in ("conc 1", "conc 2", "conc 4"):
        assert f"== {label}:" in done.stdout
    pngs = sorted((folder / "report").glob("*.png"))
    assert len(pngs) >= 4 and all(p.stat().st_size > 1000 for p in pngs)
    html = (folder / "report" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(pngs)
    assert "<h2>Pareto evidence per curve</h2>" in html and "3 points measured (conc 1, conc 2, conc 4" in html
    assert "nanobind" not in done.stderr


def test_a_dead_tensor_parallel_rank_ends_the_bench_with_partial_results(sessions, tmp_path):
    """In-process the engine steps on a thread of the client's own process: a rank that stops
    answering must fail the run the ordinary way (partial results kept) - the watchdog must not
    end the process, as it does in the server's engine process."""
    traces = sessions({"n_requests": 30, "think": 0.05})
    # 5 s: the ranks' rendezvous waits twice the step timeout, and a loaded 2-core machine
    # running tests in parallel can take longer than 4 s to start the second rank
    prelude = ("import os, signal\n"
               "os.environ['AGENTLOAD_TP_STEP_TIMEOUT_S'] = '5'\n"
               "import server.engine.core as core, server.distributed.supervisor as par\n"
               "worker_sets, real_spawn = [], par.WorkerSet.spawn.__func__\n"
               "def spawn(cls, *args, **kwargs):\n"
               "    worker_sets.append(real_spawn(cls, *args, **kwargs))\n"
               "    return worker_sets[-1]\n"
               "par.WorkerSet.spawn = classmethod(spawn)\n"
               "real_step, steps = core.Engine.step, []\n"
               "def killing_step(self):\n"
               "    steps.append(1)\n"
               "    if len(steps) == 40:\n"
               "        os.kill(worker_sets[0].procs[1].pid, signal.SIGSTOP)\n"
               "    return real_step(self)\n"
               "core.Engine.step = killing_step\n")
    done = _bench(tmp_path / "rank", "--traces", str(traces), "--conc", "1", "--duration", "30",
                  "--token-scale", "1", "--tp", "2", *ENGINE_FLAGS, prelude=prelude)
    assert done.returncode == 1, done.stderr
    assert "did not answer within 5 s" in done.stderr
    doc = orjson.loads((tmp_path / "rank" / "result.json").read_bytes())
    assert doc["status"] == "server_dead"
    (level,) = doc["levels"]
    assert level["counts"]["requests_ok"] > 0


def test_capacity_against_our_server_writes_the_search_and_its_report(http_server, tmp_path):
    # the bundled sessions fitted to tiny as bench fits them; three short probes keep it brief
    out = tmp_path / "capacity"
    done = _loadgen("capacity", "--url", http_server, "--slo", "standard", "--duration", "4", "--max-probes", "3",
                    "--out", str(out), "--quiet")
    assert done.returncode in (0, 1), done.stderr  # 1: the SLO failed even at 1 agent on a busy machine
    doc = orjson.loads((out / "result.json").read_bytes())
    found = doc["capacity"]
    assert found["slo"] == {"name": "standard", "spec": "ttft<=5s,interactivity>=20"} and found["unit"] == "agents"
    assert 1 <= len(found["probes"]) <= 3 and [level["label"] for level in doc["levels"]] == [
        p["label"] for p in found["probes"]]
    assert doc["config"]["traces"]["scale"]["config"]["token_scale"] == 0.02  # tiny's preset
    html = (out / "report" / "report.html").read_text()
    assert (out / "report" / "capacity.png").stat().st_size > 0 and "<h2>Capacity</h2>" in html


def test_our_servers_metrics_are_scraped_into_every_level(http_server, replay, sessions):
    traces = sessions({"n_requests": 6, "think": 0.0}, {"n_requests": 5, "think": 0.0})
    code, doc, _ = replay(http_server, "--traces", str(traces), "--conc", "2", "--duration", "3",
                          "--server-metrics-interval", "0.5", "--token-scale", "1", "--think-time-scale", "1")
    assert code == 0
    metrics = doc["levels"][0]["server_metrics"]
    assert metrics["adapter"] == "ours" and metrics["failed_scrapes"] == 0 and metrics["scrapes"] >= 5
    window = metrics["window"]
    assert window["running"]["max"] >= 1 and window["prompt_tokens"] > 0 and window["generation_tokens"] > 0
    assert window["preemptions"] == 0 and 0 <= window["kv_cache_usage"]["max"] <= 1
    assert doc["levels"][0]["cache"]["server_hit_rate"] == window["prefix_cache_hit_rate"]
