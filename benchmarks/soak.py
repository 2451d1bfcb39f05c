"""A soak: our tiny CPU server under a steady `loadgen replay` for minutes, watching for what only
time shows - requests that vanish, memory that grows.

Starts `server start --model tiny --device cpu` on a free loopback port, then one `loadgen replay`
level of `--minutes` (the bundled sessions fitted to tiny, conc `--conc`, a per-request file),
while the server's processes' resident memory (the API process and its engine child) is sampled
every `--sample-every` seconds. Reported:

- requests: the per-request file's records that succeeded against the server's own success
  counter (`vllm:request_success_total`, summed over finish reasons) grown over the run: they must
  be equal - a request the server finished that the client never recorded is lost;
- RSS: the first and last samples, and the slope of a least-squares line through the samples after
  the first quarter of the run (the warm-up's allocations left out), in MiB per minute, per process.

    python benchmarks/soak.py --minutes 10 --json soak.json
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY = re.compile(r"ready at (http://\S+) \(model \S+, engine pid (\d+)\)")
SUCCESS = re.compile(r'^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$', re.M)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def successes(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return sum(float(v) for v in SUCCESS.findall(resp.read().decode()))


def slope_per_min(times: list[float], values: list[float]) -> float | None:
    """Least-squares slope, in units per minute; None with fewer than 3 points."""
    if len(times) < 3:
        return None
    mean_t, mean_v = sum(times) / len(times), sum(values) / len(values)
    var = sum((t - mean_t) ** 2 for t in times)
    return 60 * sum((t - mean_t) * (v - mean_v) for t, v in zip(times, values)) / var if var else None


def start_server(log: Path) -> tuple[subprocess.Popen, str, int]:
    port = free_port()
    handle = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "start", "--model", "tiny", "--device", "cpu",
                             "--port", str(port)], cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        match = READY.search(log.read_text())
        if match:
            return proc, match.group(1), int(match.group(2))
        if proc.poll() is not None:
            sys.exit(f"soak: the server exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        time.sleep(0.5)
    proc.kill()
    sys.exit("soak: the server did not start in 180 s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0, help="the replay's window (default %(default)s)")
    p.add_argument("--conc", type=int, default=4, help="lanes (default %(default)s)")
    p.add_argument("--sample-every", type=float, default=10.0, help="RSS sampling period, s (default %(default)s)")
    p.add_argument("--json", help="also write the report here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="agentload-soak-") as tmp:
        work = Path(tmp)
        server, url, engine_pid = start_server(work / "server.log")
        samples: list[tuple[float, float | None, float | None]] = []
        stop = threading.Event()

        def sample() -> None:
            began = time.monotonic()
            while not stop.wait(0 if not samples else args.sample_every):
                samples.append((time.monotonic() - began, rss_mib(server.pid), rss_mib(engine_pid)))

        sampler = threading.Thread(target=sample, daemon=True)
        try:
            before = successes(url)
            sampler.start()
            per_request = work / "requests.jsonl"
            replay = subprocess.run([sys.executable, "-m", "loadgen.cli", "replay", "--url", url, "--conc",
                                     str(args.conc), "--duration", str(args.minutes * 60), "--warmup", "2req",
                                     "--per-request", str(per_request), "--out", str(work / "out"), "--quiet"],
                                    cwd=ROOT)
            stop.set()
            sampler.join()
            grown = successes(url) - before
        finally:
            server.terminate()
            server.wait(60)
        records = [json.loads(line) for line in per_request.read_text().splitlines()]
    ok = sum(1 for r in records if r["error"] is None)
    tail = [s for s in samples if s[0] >= args.minutes * 60 / 4]
    report = {
        "minutes": args.minutes, "conc": args.conc, "replay_exit_code": replay.returncode,
        "records_ok": ok, "records_failed": len(records) - ok, "server_successes": int(grown),
        "lost": int(grown) - ok,
        "rss_mib": {name: {"first": round(samples[0][i], 1), "last": round(samples[-1][i], 1),
                           "slope_mib_per_min": round(slope, 3) if (slope := slope_per_min(
                               [s[0] for s in tail], [s[i] for s in tail])) is not None else None}
                    for i, name in ((1, "api"), (2, "engine")) if samples and samples[0][i] is not None},
        "samples": len(samples),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    sys.exit(0 if report["lost"] == 0 and replay.returncode == 0 else 1)


if __name__ == "__main__":
    main()
