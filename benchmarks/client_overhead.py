"""Client overhead of `loadgen replay`: CPU per streamed token and per request, achieved tokens/s,
TTFT error against the server's own send timestamps, and start-up time.

The server is tests/loadgen/sse_server.py in its own process (pinned to the last core when the
OS allows; the client is pinned to the first), streaming `--osl` tokens per request with the
given delays. The client is the real `loadgen replay` path (plan, runner, HTTP transport, HDR
recording) run in this process over synthetic sessions with no think time. Client CPU is
getrusage(RUSAGE_SELF) over the measurement window. `preempted_per_s`: the client's involuntary
context switches over the same span per second of the window (other processes taking its core);
on a shared machine they, not the client's own work, can make the TTFT error's tail.

TTFT error, two views (both from perf_counter_ns = CLOCK_MONOTONIC, shared by the processes):
  receive: client's first-chunk timestamp - the end of the server's first write call (how late
           the client notices; 0 when it lands inside the write call);
  full:    client TTFT - server TTFT (first write - request received): also includes the time
           the request spends between the client's send and the server's handler.

    python benchmarks/client_overhead.py                 # the default grid, prints a table
    python benchmarks/client_overhead.py --conc 256 --first-ms 50 --itl-ms 10 --duration 10
    python benchmarks/client_overhead.py --conc 256 --first-ms 50 --itl-ms 10 --duration 4 --repeats 5 --no-startup

Placement: by default the client runs on the first core and the server on the last, and the
`--scaling` rows (client workers against the cheap zero-delay server) share every core. With
`--client-cpus` and `--server-cpus` (on a host with cores to spare) the client, its worker
processes included, gets only its cores and the server only its own, so a scaling row measures
the client's limit, not the server's; the rows report the server's CPU share to show it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "loadgen"))

from loadgen.run.affinity import parse_cpus, placed_on  # noqa: E402

if TYPE_CHECKING:
    from conftest import ServerProcess


def server_process(config: dict, cpu: int | None = None) -> ServerProcess:
    """tests/loadgen/sse_server.py in its own process, through the tests' launcher. Imported here, not
    at the top: tests/loadgen/conftest.py imports pytest, which a host that runs only the scripts that
    import this file's helpers (many_sessions.py, think_time_ceiling.py) need not have."""
    from conftest import ServerProcess

    return ServerProcess(config, cpu=cpu)


def write_traces(folder: Path, osl: int, sessions: int = 64, requests: int = 400) -> None:
    for s in range(sessions):
        inputs = [256 + 64 * (i % 4) for i in range(requests)]
        items = [{"t": 0.0, "type": "n", "in": n, "out": osl, "hash_ids": list(range(1, n // 64 + 1)),
                  "think_time": 0.0} for n in inputs]
        doc = {"id": f"bench{s}", "models": ["m"], "block_size": 64, "requests": items}
        with gzip.open(folder / f"bench{s}.json.gz", "wt") as handle:
            json.dump(doc, handle)


def pin(cpu: int) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})


class FastServer:
    """benchmarks/fast_sse_server.py (zero delay, little CPU per token), one process per CPU it is
    given, so that it is not what limits a client's scaling."""

    def __init__(self, cpus: set[int] | None = None) -> None:
        processes = str(len(cpus) if cpus else 1)
        with placed_on(frozenset(cpus) if cpus else None):  # from its start, every thread of it
            self.proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "fast_sse_server.py"),
                                          "--processes", processes], stdout=subprocess.PIPE, text=True,
                                         start_new_session=True)
        fields = self.proc.stdout.readline().split()
        self.url = f"http://127.0.0.1:{int(fields[1])}"
        self.pids = [int(pid) for pid in fields[3].split(",")]

    def records(self) -> dict:
        return {"records": []}

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # the forked processes too
        self.proc.wait(timeout=10)


def server_config(first_ms: float, itl_ms: float, usage_apart: bool) -> dict:
    """tests/loadgen/sse_server.py's config for one delay case (one token a chunk)."""
    return {"first_ms": first_ms, "itl_ms": itl_ms, "tokens_per_chunk": 1, "usage_apart": usage_apart}


def run_case(conc: int, first_ms: float, itl_ms: float, osl: int, duration: float, server_cpu: int | None,
             workers: int = 1, fast_server: bool = False, server_cpus: set[int] | None = None,
             usage_apart: bool = False) -> dict:
    from loadgen.cli import main

    server = FastServer(server_cpus) if fast_server else server_process(
        server_config(first_ms, itl_ms, usage_apart), cpu=server_cpu)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tmp_path = Path(tmp)
            write_traces(tmp_path, osl)
            out = tmp_path / "out"
            pids = server.pids if isinstance(server, FastServer) else [server.proc.pid]
            server_cpu_before = sum(map(_process_cpu, pids))
            code = main(["replay", "--url", server.url, "--traces", str(tmp_path), "--conc", str(conc),
                         "--duration", str(duration), "--warmup", "1s", "--start-offset", "0:0",
                         "--workers", str(workers),
                         "--out", str(out), "--per-request", str(out / "req.jsonl"), "--quiet"])
            server_cpu_s = sum(map(_process_cpu, pids)) - server_cpu_before
            level = json.loads((out / "result.json").read_text())["levels"][0]
            records = [json.loads(line) for line in (out / "req.jsonl").read_text().splitlines()]
        seen = {r["id"]: r for r in server.records()["records"]}
    finally:
        server.stop()
    counted = [r for r in records if r["counted"]]
    counts, client = level["counts"], level["client"]
    tokens = counts["output_tokens"]
    return {
        "client": f"loadgen --workers {workers}, {read_path()} reads" + (f" (fast server x{len(pids)})" if fast_server else ""),
        "conc": conc,
        "first_ms": first_ms,
        "itl_ms": itl_ms, "osl": osl, "exit": code,
        "requests": counts["requests_ok"], "errors": counts["errors_total"],
        "tok_s": level["throughput"]["output_tokens_per_s"],
        "cpu_us_per_token": 1e6 * client["cpu_s"] / tokens if tokens else None,
        "cpu_us_per_request": 1e6 * client["cpu_s"] / counts["requests_ok"] if counts["requests_ok"] else None,
        "sys_us_per_token": 1e6 * client["cpu_sys_s"] / tokens if tokens else None,
        "cpu_util": client["cpu_util"], "server_cpu_util": server_cpu_s / (duration + 2.0),
        "preempted_per_s": client["preempted_per_s"],
        **(_errors(counted, seen) if seen else {}),
        "loop_lag_ms_p99": (level["metrics"]["loop_lag"]["stats"]["p99"] or 0) / 1000,
    }


def read_path() -> str:
    """How loadgen reads plain-http responses here (loadgen/transport/wire.py): compiled or python."""
    from loadgen.transport.readpath import compiled_reads_available

    return "compiled" if compiled_reads_available() else "python"


def run_bare_case(conc: int, first_ms: float, itl_ms: float, osl: int, duration: float,
                  server_cpu: int | None, usage_apart: bool = False) -> dict:
    """The same load through benchmarks/bare_client.py: the floor."""
    from bare_client import run_bare

    server = server_process(server_config(first_ms, itl_ms, usage_apart), cpu=server_cpu)
    try:
        result = run_bare(server.url, conc, osl, 1.0, duration)
        seen = {r["id"]: r for r in server.records()["records"]}
    finally:
        server.stop()
    tokens, records = result["tokens"], result["records"]
    return {
        "client": "bare uvloop", "conc": conc, "first_ms": first_ms, "itl_ms": itl_ms, "osl": osl, "exit": 0,
        "requests": len(records), "errors": 0, "tok_s": tokens / duration,
        "cpu_us_per_token": 1e6 * result["cpu_s"] / tokens if tokens else None,
        "cpu_us_per_request": 1e6 * result["cpu_s"] / len(records) if records else None,
        "sys_us_per_token": 1e6 * result["sys_s"] / tokens if tokens else None,
        "cpu_util": result["cpu_s"] / duration, "server_cpu_util": None,
        "preempted_per_s": result["preempted"] / duration,  # over the window and the drain, as loadgen's
        **_errors(records, seen), "loop_lag_ms_p99": None,
    }


def _errors(records: list[dict], seen: dict) -> dict:
    """TTFT error two ways (see the module docstring) and the E2EL error: the client's last-chunk
    time minus the end of the server's last content write."""
    receive = sorted(_lateness(r["first_ns"], seen[r["id"]]) / 1e6 for r in records)
    full = sorted(((r["first_ns"] - r["start_ns"]) - (seen[r["id"]]["writes_ns"][0] - seen[r["id"]]["received_ns"])) / 1e6
                  for r in records)
    e2el = sorted(max(0, r["last_ns"] - seen[r["id"]]["written_ns"][-1]) / 1e6 for r in records)
    return {"recv_err_ms_p50": _pct(receive, 50), "recv_err_ms_p99": _pct(receive, 99),
            "full_err_ms_p50": _pct(full, 50), "full_err_ms_p99": _pct(full, 99),
            "e2el_err_ms_p50": _pct(e2el, 50), "e2el_err_ms_p99": _pct(e2el, 99)}


def _process_cpu(pid: int) -> float:
    """User + system CPU seconds of another process (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _lateness(arrival_ns: int, server: dict) -> int:
    """How much later the client stamped the first chunk than the server finished writing it
    (0 inside the server's write call: the kernel can deliver it before the call returns)."""
    return max(0, arrival_ns - server["written_ns"][0])


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


_BUSY_LOOP = """
import sys, time
start = time.perf_counter(); n = 0
while time.perf_counter() - start < float(sys.argv[1]):
    n += 1
print(n)
"""


def busy_rate(cpus: list[int], seconds: float = 1.0) -> float:
    """Loop turns of a Python busy loop per second, summed over one process per CPU run at once."""
    procs = []
    for cpu in cpus:
        with placed_on(frozenset({cpu})):
            procs.append(subprocess.Popen([sys.executable, "-c", _BUSY_LOOP, str(seconds)], stdout=subprocess.PIPE,
                                          text=True))
    return sum(int(proc.communicate()[0]) for proc in procs) / seconds


def cpu_independence(cpus: list[int]) -> float:
    """How the client's CPUs share a core: a busy loop on all of them at once against each alone
    (1.0: separate physical cores; about 0.6: hardware threads of one core, which a VM that reports
    one thread per core cannot tell us)."""
    alone = sum(busy_rate([cpu]) for cpu in cpus)
    return busy_rate(cpus) / alone


def startup_times(repeats: int = 5) -> dict:
    """Wall time of `loadgen replay --help`, and of a client from spawn to its first request
    (small synthetic traces, and the bundled agentic-coding sessions). The packages are compiled
    to bytecode first, as `pip install` does: a source tree under PYTHONDONTWRITEBYTECODE=1 would
    otherwise charge every spawn for compiling the client's modules."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-m", "compileall", "-q", "loadgen", "traces", "golden_al"], cwd=ROOT,
                   env=env, capture_output=True, check=True)
    help_times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "loadgen.cli", "replay", "--help"], cwd=ROOT,
                       capture_output=True, check=True)
        help_times.append(time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as tmp:
        write_traces(Path(tmp), 8, sessions=2, requests=4)
        small = _first_request_s(["--traces", tmp], Path(tmp), repeats)
        bundled = _first_request_s([], Path(tmp), repeats)
    return {"help_s": statistics.median(help_times), "first_request_s": small, "first_request_bundled_s": bundled}


def _first_request_s(flags: list[str], tmp: Path, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        server = server_process({})
        try:
            t0 = time.perf_counter_ns()
            subprocess.run([sys.executable, "-m", "loadgen.cli", "replay", "--url", server.url, *flags,
                            "--conc", "1", "--duration", "0.2", "--quiet", "--out", str(tmp / "o")],
                           cwd=ROOT, capture_output=True)
            first = min(r["received_ns"] for r in server.records()["records"])
            times.append((first - t0) / 1e9)
        finally:
            server.stop()
    return statistics.median(times)


HEADER = ("client", "conc", "first_ms", "itl_ms", "tok_s", "cpu_us_per_token", "cpu_vs_bare", "sys_us_per_token",
          "cpu_us_per_request", "cpu_util", "server_cpu_util", "recv_err_ms_p50", "recv_err_ms_p99",
          "full_err_ms_p50", "full_err_ms_p99", "e2el_err_ms_p50", "e2el_err_ms_p99", "loop_lag_ms_p99", "preempted_per_s",
          "errors")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conc", default="64,256", help="concurrency levels (default 64,256; '' for none)")
    parser.add_argument("--first-ms", type=float, help="one delay case: ms to the first token")
    parser.add_argument("--itl-ms", type=float, help="one delay case: ms between tokens")
    parser.add_argument("--osl", type=int, default=64, help="output tokens per request (default 64)")
    parser.add_argument("--duration", type=float, default=8.0, help="window seconds per case (default 8)")
    parser.add_argument("--scaling", type=int, metavar="CONC",
                        help="also: --workers 1 vs 2 at this concurrency against fast_sse_server.py (zero delay, "
                        "cheap per token), nothing pinned")
    parser.add_argument("--client-cpus", help="cores for the client (the overhead rows use the first), e.g. 0,1")
    parser.add_argument("--server-cpus", help="cores for the server (the overhead rows use the first), e.g. 2,3")
    parser.add_argument("--usage-apart", action="store_true",
                        help="the server sends usage and [DONE] in chunks of their own, each an ITL after the one "
                        "before (vLLM's usage chunk, read apart from [DONE]); default: both in the last write")
    parser.add_argument("--no-startup", action="store_true", help="skip the start-up timings")
    parser.add_argument("--startup-repeats", type=int, default=5, help="runs per start-up timing (default 5)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="bare/loadgen pairs per overhead case, run alternately (default 1); with more than one, "
                        "each pair's ratio and their median are printed: the floor moves between runs on a shared "
                        "host, and a pair measured back to back shares most of that movement")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats: {args.repeats}: must be at least 1")
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    client_cpus = sorted(parse_cpus(args.client_cpus, "--client-cpus")) if args.client_cpus else cpus
    server_cpus = sorted(parse_cpus(args.server_cpus, "--server-cpus")) if args.server_cpus else cpus[-1:]
    server_cpu = server_cpus[0] if len(cpus) > 1 else None
    if server_cpu is not None:
        pin(client_cpus[0])
    load_before = os.getloadavg()[0]
    delays = [(args.first_ms or 0.0, args.itl_ms or 0.0)] if args.first_ms is not None or args.itl_ms is not None \
        else [(0.0, 0.0), (50.0, 10.0)]
    rows, pair_ratios = [], {}
    for first, itl in delays:
        for conc in (int(c) for c in args.conc.split(",") if c):
            for _ in range(args.repeats):
                bare = run_bare_case(conc, first, itl, args.osl, args.duration, server_cpu, args.usage_apart)
                ours = run_case(conc, first, itl, args.osl, args.duration, server_cpu, usage_apart=args.usage_apart)
                if bare["cpu_us_per_token"] and ours["cpu_us_per_token"]:
                    ours["cpu_vs_bare"] = ours["cpu_us_per_token"] / bare["cpu_us_per_token"]
                    pair_ratios.setdefault(f"conc {conc}, {first:g}+{itl:g} ms", []).append(ours["cpu_vs_bare"])
                rows += [bare, ours]
    if args.scaling:
        placed = bool(args.client_cpus and args.server_cpus)
        if cpus:  # the workers inherit it; unplaced, they and the server share every core
            os.sched_setaffinity(0, set(client_cpus) if placed else set(cpus))
        rows += [run_case(args.scaling, 0.0, 0.0, args.osl, args.duration, None, workers=n, fast_server=True,
                          server_cpus=set(server_cpus) if placed else None)
                 for n in (1, 2)]
    start = None if args.no_startup else startup_times(args.startup_repeats)
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for row in rows:
        print("| " + " | ".join(_fmt(row.get(k)) for k in HEADER) + " |")
    if args.repeats > 1:
        print()
        for case, ratios in pair_ratios.items():
            print(f"{case}: CPU per token x bare, {len(ratios)} alternated pairs: "
                  f"{', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}")
    if start:
        print(f"\nstart-up: `loadgen replay --help` {start['help_s'] * 1000:.0f} ms; client spawn -> first request "
              f"{start['first_request_s'] * 1000:.0f} ms (small traces), {start['first_request_bundled_s'] * 1000:.0f} ms "
              f"(bundled sessions) (medians of {args.startup_repeats})")
    scaling = (f"client on CPUs {args.client_cpus}, server on CPUs {args.server_cpus}"
               if args.client_cpus and args.server_cpus else "both unpinned")
    if args.scaling and len(client_cpus) > 1 and hasattr(os, "sched_setaffinity"):
        scaling += (f"; busy loops on the client's CPUs at once run at {cpu_independence(client_cpus):.2f} "
                    "of each alone (1.0: separate cores)")
    ending = "usage and [DONE] apart (--usage-apart)" if args.usage_apart else "usage and [DONE] in one write"
    print(f"overhead rows' streams end with {ending}; "
          f"client pinned to CPU {client_cpus[0] if server_cpu is not None else '-'}, server to CPU {server_cpu} "
          f"(scaling rows: {scaling}); {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average "
          f"before/after: {load_before:.2f} / {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "pair_ratios": pair_ratios, "startup": start,
                                               "usage_apart": args.usage_apart}, indent=2))


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


if __name__ == "__main__":
    main()
