"""Timing accuracy of `loadgen replay` at thousands of sessions with full-length prompts (issue 38,
item 6): TTFT error against a ground-truth server, client-caused errors, and the client's CPU per
request with the part spent building request bodies.

    python benchmarks/many_sessions.py --conc 256,1024 --workers 2,auto          # the 2-core VM
    python benchmarks/many_sessions.py --conc 4096 --workers auto --server-processes 4 \\
        --server-cpus 12-15 --client-cpus 0-11 --timeout 60 --json many.json     # a 16-core host

Per case (a concurrency N and a `--workers` value): benchmarks/truth_server.py, `--server-processes`
processes on 127.0.0.1, first chunk `--first-ms` after a request's body is complete, then a chunk
of `--tokens-per-chunk` tokens every `--itl-ms`; and `loadgen replay --conc N` over the bundled
agentic-coding sessions at full length (`--token-scale 1`: the real prompts, request bodies of
hundreds of KB; no context cap), run through benchmarks/build_probe.py, which times the prompt
synthesis and body encoding in every client process. A fresh server per case, so request ids
never repeat within its records.

Load: think times as recorded, capped at `--think-time-cap` (default 30 s; 449 of the 2,101
think times are longer, the median is 9 s). At the recorded times (mean 326 s, p99 70 min) a
window of tens of seconds would hold a handful of requests per thousand lanes; with the cap a
lane sends every ~12 s (subagents included; measured: 22 requests/s at 256 lanes, 84 at 1,024),
with every think time as recorded where it is shorter than the cap. Four tokens a chunk every 10 ms (a
speculative-decoding server's chunks, 400 tokens/s a stream) keep the longest response (9,183
tokens) under 25 s, which bounds the drain after the window.

TTFT error, per window request matched to the server's record by X-Request-Id (perf_counter_ns =
CLOCK_MONOTONIC on both sides):
  error   = client TTFT (its kernel stamp of the first chunk - when it handed the request to the
            wire) - server TTFT (the first chunk's write - the kernel's arrival stamp of the
            request's first bytes at the server);
  send    = arrival - the client's start: a new connection's connect, the write of the body;
  receive = the client's stamp of the first chunk - the end of the server's write (negative when
            it landed inside the write call); error = send + receive + the write call itself.
The server's own lag is in its records, not in the error: `server_read_lag` (its read of a
request's first bytes - their kernel arrival stamp) and `server_write_lag` (first write - when it
was due). Only through one path can it reach the error, and only upwards: segments that queue
together keep the newest stamp, so a late read of a request still arriving stamps it late.
Client CPU per request is loadgen's own (`client.cpu_s` of the window and drain, the worker
processes summed, over the window's requests); the build part is the probe's CPU per prompt
synthesised and per body encoded (over every request sent, warm-up included).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson
from build_probe import PROBE_DIR_ENV
from build_probe import read as read_probe
from client_overhead import ROOT, _process_cpu

from loadgen.results.file import read_results
from loadgen.run.affinity import parse_cpus, placed_on

HERE = Path(__file__).resolve().parent
RECORDS_WAIT_S = 30.0  # a server process writes its records on SIGTERM: seconds to wait for them all


class TruthServer:
    """benchmarks/truth_server.py in its own session (its forked processes are killed with it)."""

    def __init__(self, args: argparse.Namespace, records: Path, cpus: frozenset[int] | None) -> None:
        self.records = records
        command = [sys.executable, str(HERE / "truth_server.py"), "--processes", str(args.server_processes),
                   "--first-ms", str(args.first_ms), "--itl-ms", str(args.itl_ms),
                   "--tokens-per-chunk", str(args.tokens_per_chunk), "--records", str(records)]
        with placed_on(cpus):  # every process of it, from its start
            self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
        fields = self.proc.stdout.readline().split()
        if fields[:1] != ["PORT"]:
            self.kill()
            sys.exit(f"many_sessions: the truth server did not start (said {fields!r})")
        self.url = f"http://127.0.0.1:{fields[1]}"
        self.pids = [int(pid) for pid in fields[3].split(",")]

    def cpu_s(self) -> float:
        return sum(map(_process_cpu, self.pids))

    def stop(self) -> list[dict]:
        """Every process's records (SIGTERM makes each write them), as one dict per request."""
        os.killpg(self.proc.pid, signal.SIGTERM)
        files = [self.records / f"server-{pid}.json" for pid in self.pids]
        deadline = time.monotonic() + RECORDS_WAIT_S
        while not all(path.exists() for path in files):
            if time.monotonic() > deadline:
                self.kill()
                sys.exit(f"many_sessions: the truth server wrote no records within {RECORDS_WAIT_S:g} s")
            time.sleep(0.05)
        self.proc.wait(timeout=RECORDS_WAIT_S)
        rows = []
        for path in files:
            doc = orjson.loads(path.read_bytes())
            rows += [dict(zip(doc["fields"], row)) for row in doc["rows"]]
        return rows

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)


class CpuSampler(threading.Thread):
    """Every SAMPLE_S: the machine's busy CPU time (/proc/stat), the server's and the client's (the
    replay process and its worker processes) CPU seconds, so each one's cores during the window
    are known: loadgen's own `client.cpu_s` also spans the drain, and other work on a shared host
    shows as the machine's busy time that neither of them used (the loopback's softirq work is
    charged to the process it interrupts: ~0 `other` with nothing else running, at 500 requests/s)."""

    SAMPLE_S = 0.25

    def __init__(self, server: TruthServer, client_pid: int) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.client_pid = client_pid
        self.samples: list[tuple[int, float, float, float]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.SAMPLE_S):
            client = [self.client_pid, *_children(self.client_pid)]
            self.samples.append((time.perf_counter_ns(), _machine_busy_s(), self.server.cpu_s(),
                                 sum(map(_process_cpu, client))))

    def cores(self, start_ns: int, end_ns: int) -> dict[str, float | None]:
        """Cores used between the samples nearest inside [start_ns, end_ns]: the machine's busy ones,
        the server's, the client's, and the rest (other work)."""
        names = ("machine_cores", "server_cores", "client_cores")
        inside = [s for s in self.samples if start_ns <= s[0] <= end_ns]
        if len(inside) < 2:
            return dict.fromkeys((*names, "other_cores"))
        (t0, *first), (t1, *last) = inside[0], inside[-1]
        cores = {name: round((b - a) / ((t1 - t0) / 1e9), 2) for name, a, b in zip(names, first, last)}
        other = cores["machine_cores"] - cores["server_cores"] - cores["client_cores"]
        return {**cores, "other_cores": round(other, 2)}


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _machine_busy_s() -> float:
    """CPU seconds all cores have spent busy since boot: /proc/stat's first line but idle and iowait."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def replay_command(args: argparse.Namespace, url: str, conc: int, workers: str, out: Path) -> list[str]:
    return [sys.executable, str(HERE / "build_probe.py"), "replay", "--url", url, "--conc", str(conc),
            "--workers", workers, "--duration", str(args.duration), "--warmup", f"{args.warmup:g}s",
            "--token-scale", "1", "--think-time-scale", str(args.think_time_scale),
            "--think-time-cap", str(args.think_time_cap), "--seed", str(args.seed), "--timeout", str(args.timeout),
            "--out", str(out), "--per-request", str(out / "requests.jsonl")]


def run_case(args: argparse.Namespace, conc: int, workers: str, server_cpus: frozenset[int] | None,
             client_cpus: frozenset[int] | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "probe").mkdir()
        (folder / "server").mkdir()
        out = folder / "out"
        load_before = os.getloadavg()
        server = TruthServer(args, folder / "server", server_cpus)
        try:
            env = dict(os.environ, **{PROBE_DIR_ENV: str(folder / "probe")})
            log = folder / "replay.log"
            bound = args.warmup + args.duration + args.timeout + 120  # start-up, warm-up, window, drain
            with placed_on(client_cpus), log.open("w") as sink:
                started = time.monotonic()
                replay = subprocess.Popen(replay_command(args, server.url, conc, workers, out), cwd=ROOT, env=env,
                                          stdout=sink, stderr=subprocess.STDOUT)
            sampler = CpuSampler(server, replay.pid)
            sampler.start()
            try:
                code = replay.wait(timeout=bound)
            finally:
                sampler.done.set()
                replay.kill()  # a no-op once it has exited
            wall_s = time.monotonic() - started
            rows = server.stop()
        except BaseException:
            server.kill()
            raise
        text = log.read_text()
        if not (out / "result.json").exists():
            sys.exit(f"many_sessions: the replay at conc {conc} wrote no results (exit {code}):\n{text[-3000:]}")
        row = analyse(out, rows, read_probe(folder / "probe"), sampler)
    used = re.search(r"client: (\d+) worker", text)
    return {"conc": conc, "workers_flag": workers, "workers": int(used.group(1)) if used else 1,
            "server_processes": args.server_processes, "exit": code, "replay_wall_s": round(wall_s, 1),
            "load_before": round(load_before[0], 2), "load_after": round(os.getloadavg()[0], 2), **row}


def analyse(out: Path, server_rows: list[dict], probe: dict[str, int], sampler: CpuSampler) -> dict:
    level = read_results(out / "result.json")["levels"][0]
    counts, client = level["counts"], level["client"]
    records = [orjson.loads(line) for line in (out / "requests.jsonl").read_bytes().splitlines()]
    seen = {row["id"]: row for row in server_rows}
    pairs = [(r, seen[r["id"]]) for r in records if r["counted"] and r["id"] in seen]
    starts = [r["start_ns"] for r, _ in pairs]  # the window: from its first request's start to its last's
    client_ttft = np.array([r["first_ns"] - r["start_ns"] for r, _ in pairs], dtype=np.int64)
    server_ttft = np.array([s["write_ns"] - s["arrived_ns"] for _, s in pairs], dtype=np.int64)
    send = np.array([s["arrived_ns"] - r["start_ns"] for r, s in pairs], dtype=np.int64)
    receive = np.array([r["first_ns"] - s["written_ns"] for r, s in pairs], dtype=np.int64)
    read_lag = np.array([s["noticed_ns"] - s["arrived_ns"] for _, s in pairs], dtype=np.int64)
    write_lag = np.array([s["write_ns"] - s["due_ns"] for _, s in pairs], dtype=np.int64)
    body_kb = np.array([s["body_bytes"] / 1e3 for _, s in pairs])
    ok = counts["requests_ok"]
    built = probe.get("body_calls", 0)
    lag = level["metrics"]["loop_lag"]["stats"]
    return {
        "requests": ok, "matched": len(pairs), "errors": counts["errors"],
        "warmup_errors": counts["warmup_errors"], "max_inflight": counts["max_inflight_requests"],
        "mean_inflight": counts["mean_inflight_requests"], "requests_per_s": level["throughput"]["requests_per_s"],
        "output_tok_s": level["throughput"]["output_tokens_per_s"],
        **_stats("ttft_err_ms", client_ttft - server_ttft), **_stats("send_ms", send),
        **_stats("receive_ms", receive), **_stats("server_read_lag_ms", read_lag),
        **_stats("server_write_lag_ms", write_lag),
        "body_kb_p50": _pct(body_kb, 50), "body_kb_max": _pct(body_kb, 100),
        "stalled_writes": sum(s["stalled"] for _, s in pairs),
        **sampler.cores(min(starts, default=0), max(starts, default=0)),
        "preempted_per_s": client["preempted_per_s"],
        "cpu_ms_per_request": 1e3 * client["cpu_s"] / ok if ok and client["cpu_s"] is not None else None,
        "requests_built": built,
        "prompt_ms_per_request": probe["prompt_cpu_ns"] / 1e6 / probe["prompt_calls"] if built else None,
        "body_ms_per_request": probe["body_cpu_ns"] / 1e6 / built if built else None,
        "build_wall_ms_per_request": (probe["prompt_wall_ns"] + probe["body_wall_ns"]) / 1e6 / built if built else None,
        "body_kb_built_mean": probe["body_bytes"] / 1e3 / built if built else None,
        "loop_lag_ms_p99": lag["p99"] / 1e3 if lag["p99"] is not None else None,
        "loop_lag_ms_max": lag["max"] / 1e3 if lag["max"] is not None else None,
        "client_warnings": client["warnings"],
    }


def _stats(name: str, ns: np.ndarray) -> dict[str, float | None]:
    ms = ns / 1e6
    return {f"{name}_p50": _pct(ms, 50), f"{name}_p99": _pct(ms, 99), f"{name}_max": _pct(ms, 100)}


def _pct(values: np.ndarray, p: float) -> float | None:
    return round(float(np.percentile(values, p, method="nearest")), 3) if values.size else None


HEADER = ("N", "workers", "requests", "errors", "TTFT err p50 / p99 / max (ms)", "send p99 (ms)",
          "receive p99 (ms)", "server lag read / write p99 (ms)", "body KB p50 / max", "client CPU ms/req",
          "build ms/req (prompt + body)", "cores: client / server / other", "loop lag p99 / max (ms)",
          "load before → after")


def table_row(row: dict) -> str:
    errors = ", ".join(f"{k} {v}" for k, v in sorted(row["errors"].items())) or "0"
    build = (f"{row['prompt_ms_per_request'] + row['body_ms_per_request']:.2f} ({row['prompt_ms_per_request']:.2f} "
             f"+ {row['body_ms_per_request']:.2f})" if row["requests_built"] else "-")
    cells = (row["conc"], f"{row['workers']} (`{row['workers_flag']}`)", row["requests"], errors,
             f"{_f(row['ttft_err_ms_p50'])} / {_f(row['ttft_err_ms_p99'])} / {_f(row['ttft_err_ms_max'])}",
             _f(row["send_ms_p99"]), _f(row["receive_ms_p99"]),
             f"{_f(row['server_read_lag_ms_p99'])} / {_f(row['server_write_lag_ms_p99'])}",
             f"{_f(row['body_kb_p50'], 0)} / {_f(row['body_kb_max'], 0)}", _f(row["cpu_ms_per_request"], 2), build,
             f"{_f(row['client_cores'], 2)} / {_f(row['server_cores'], 2)} / {_f(row['other_cores'], 2)}",
             f"{_f(row['loop_lag_ms_p99'])} / {_f(row['loop_lag_ms_max'])}",
             f"{row['load_before']} → {row['load_after']}")
    return "| " + " | ".join(map(str, cells)) + " |"


def _f(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conc", default="256,1024", help="concurrency levels, one case each (%(default)s)")
    parser.add_argument("--workers", default="2", help="--workers values, each run at every level: N or auto, "
                        "comma-separated (%(default)s)")
    parser.add_argument("--duration", type=float, default=30.0, help="window seconds (%(default)s)")
    parser.add_argument("--warmup", type=float, default=20.0, help="warm-up seconds: the lanes' first requests "
                        "all start at once (%(default)s)")
    parser.add_argument("--think-time-scale", type=float, default=1.0, help="%(default)s")
    parser.add_argument("--think-time-cap", type=float, default=30.0, help="seconds (%(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="replay seed (%(default)s)")
    parser.add_argument("--timeout", type=float, default=120.0, help="per-request limit, bounds the drain "
                        "(%(default)s)")
    parser.add_argument("--first-ms", type=float, default=50.0, help="server: body to first chunk (%(default)s)")
    parser.add_argument("--itl-ms", type=float, default=10.0, help="server: between chunks (%(default)s)")
    parser.add_argument("--tokens-per-chunk", type=int, default=4, help="server: tokens per chunk (%(default)s)")
    parser.add_argument("--server-processes", type=int, default=2, help="truth server processes (%(default)s)")
    parser.add_argument("--server-cpus", help="CPUs for the server, e.g. 12-15 (default: all)")
    parser.add_argument("--client-cpus", help="CPUs for the client and its workers, e.g. 0-11 (default: all)")
    parser.add_argument("--json", type=Path, help="also write the rows and the settings to this JSON file")
    args = parser.parse_args()
    server_cpus = parse_cpus(args.server_cpus, "--server-cpus") if args.server_cpus else None
    client_cpus = parse_cpus(args.client_cpus, "--client-cpus") if args.client_cpus else None
    cases = list(itertools.product((int(c) for c in args.conc.split(",")), args.workers.split(",")))
    print(f"many_sessions: {len(cases)} cases, each a {args.warmup:g} s warm-up, a {args.duration:g} s window and "
          "the drain", file=sys.stderr, flush=True)
    rows = []
    for conc, workers in cases:
        rows.append(run_case(args, conc, workers, server_cpus, client_cpus))
        print(f"many_sessions: conc {conc} --workers {workers} done: {table_row(rows[-1])}", file=sys.stderr,
              flush=True)
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for row in rows:
        print(table_row(row))
    print(f"server: {args.server_processes} truth_server.py processes, first chunk {args.first_ms:g} ms after the "
          f"body, {args.tokens_per_chunk} tokens a chunk every {args.itl_ms:g} ms; think times capped at "
          f"{args.think_time_cap:g} s (scale {args.think_time_scale:g}); {os.cpu_count()} CPUs; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k != "json"}
        args.json.write_text(json.dumps({"settings": settings, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
