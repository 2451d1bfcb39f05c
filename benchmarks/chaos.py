"""Fault injection: a `loadgen replay` against our tiny CPU server while the server is killed and
restarted, its engine is killed, connections are dropped and malformed requests arrive alongside.

Layout (loopback only): loadgen replay -> a TCP proxy in this process -> `server start` on a fixed
port. The proxy stands in for a load balancer: it always accepts, waits up to --backend-wait for
the server to be back, and can drop every connection it carries at once. It reads each request's
`X-Request-Id` on the way through, so "sent" is what really reached the wire.

Faults, one every --fault-every seconds in this order: SIGKILL the server, drop every proxied
connection, SIGKILL the engine process (the server then exits 1 by itself), drop again, SIGTERM
the server (drain with --shutdown-timeout 2); a supervisor restarts the server whenever it has
exited. All along, malformed requests go straight to the server (bad JSON, out-of-range and
unsupported fields, oversized bodies, garbage, cut bodies, slow heads, streams dropped midway, CR/LF
and 100 KB field names, a non-UTF-8 Authorization, a tiny temperature, a negative Content-Length).
Then the client against broken servers (tests/loadgen/sse_server.py's fault modes: resets, 500s,
short streams, token ids as text, more tokens than asked, inflated or negative usage counts): no
request the server saw is missing from the per-request file, each fault counted under its kind.

Reported: requests sent (unique ids seen by the proxy), completed, failed by kind, lost (sent but
in no per-request record: must be 0), whether result.json is complete (valid schema, status
complete, its counts equal to the per-request records), the malformed requests by outcome (a
5xx other than 503 would be a bug), the faults injected and the server's exit codes.

    python benchmarks/chaos.py                       # ~3 minutes, prints the report
    python benchmarks/chaos.py --duration 60 --json chaos.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadgen.results.file import ResultsError, read_results  # noqa: E402  (after the sys.path line above)

READY = re.compile(rb"ready at http://\S+ \(model \S+, engine pid (\d+)\)")
REQUEST_ID = re.compile(rb"X-Request-Id: ([^\r\n]+)\r\n")
FAULTS = ("kill_server", "drop_connections", "kill_engine", "drop_connections", "term_server")
SERVER_FLAGS = ["--model", "tiny", "--device", "cpu", "--max-model-len", "4096", "--shutdown-timeout", "2",
                "--read-timeout", "2", "--max-body-mb", "1"]
REPLAY_FLAGS = ["--token-scale", "0.02", "--think-time-scale", "0.01", "--think-time-cap", "1",
                "--max-error-rate", "1", "--quiet"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`server start` on a fixed port, restarted by `supervise` whenever it exits."""

    def __init__(self, port: int, log_dir: Path, say: Callable[[str], None]) -> None:
        self.port = port
        self.log_dir = log_dir
        self.say = say
        self.proc: subprocess.Popen | None = None
        self.engine_pid: int | None = None
        self.ready = False  # faults wait for a ready server
        self.starts = 0
        self.exit_codes: Counter = Counter()

    def start(self) -> None:
        self.starts += 1
        self.ready = False
        log = self.log_dir / f"server{self.starts}.log"
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "server.cli", "start", "--port", str(self.port),
                                          *SERVER_FLAGS], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            match = READY.search(log.read_bytes())
            if match:
                self.engine_pid = int(match.group(1))
                self.ready = True
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before ready: {log}")
            time.sleep(0.1)
        raise RuntimeError(f"server not ready after 180 s: {log}")

    async def supervise(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self.proc.poll() is not None:
                self.exit_codes[self.proc.returncode] += 1
                self.say(f"server exited with {self.proc.returncode}; restarting")
                await asyncio.to_thread(self.start)
                self.say(f"server {self.starts} ready (engine pid {self.engine_pid})")
            await asyncio.sleep(0.2)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.exit_codes[code] += 1
        return code


class Proxy:
    """A TCP proxy that waits for the backend, records request ids, and can drop everything."""

    def __init__(self, backend_port: int, backend_wait_s: float) -> None:
        self.backend_port = backend_port
        self.backend_wait_s = backend_wait_s
        self.request_ids: set[str] = set()
        self.refused_connections = 0  # clients closed because the backend stayed away
        self.dropped = 0
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self._server.close()
        self.drop_all()

    def drop_all(self) -> int:
        pairs = list(self._pairs)
        for client, backend in pairs:
            for writer in (client, backend):
                writer.transport.abort()  # RST, as a dying load balancer or a network fault does
        self.dropped += len(pairs)
        return len(pairs)

    async def _serve(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        backend_reader, backend = await self._connect_backend()
        if backend is None:
            self.refused_connections += 1
            client.transport.abort()
            return
        pair = (client, backend)
        self._pairs.add(pair)
        try:
            await asyncio.gather(self._pump(client_reader, backend, scan=True),
                                 self._pump(backend_reader, client, scan=False))
        finally:
            self._pairs.discard(pair)
            client.transport.abort()
            backend.transport.abort()

    async def _connect_backend(self) -> tuple[asyncio.StreamReader | None, asyncio.StreamWriter | None]:
        deadline = time.monotonic() + self.backend_wait_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                return await asyncio.open_connection("127.0.0.1", self.backend_port)
            await asyncio.sleep(0.1)
        return None, None

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, scan: bool) -> None:
        tail = b""
        try:
            while data := await reader.read(65536):
                if scan:
                    window = tail + data
                    self.request_ids.update(m.decode() for m in REQUEST_ID.findall(window))
                    tail = window[-200:]
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        # One side ended: end the other one too (a half-open pair would hang a keep-alive client).
        writer.transport.abort()


# ---- malformed requests -------------------------------------------------------------------------

def _post(path: str, body: bytes, extra: str = "") -> bytes:
    """A POST as raw bytes; the head is latin-1, so `extra` can carry any byte (a header that is not UTF-8)."""
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1") + body


MALFORMED = {
    "bad_json": _post("/v1/completions", b'{"prompt": "x", '),
    "json_array": _post("/v1/completions", b"[1, 2]"),
    "top_k_negative": _post("/v1/completions", b'{"prompt": "x", "top_k": -5}'),
    "min_p_unsupported": _post("/v1/completions", b'{"prompt": "x", "min_p": 0.5}'),
    "max_tokens_string": _post("/v1/completions", b'{"prompt": "x", "max_tokens": "5"}'),
    "no_prompt": _post("/v1/completions", b'{"max_tokens": 2}'),
    "chat_bad_role": _post("/v1/chat/completions", b'{"messages": [{"role": "robot", "content": "x"}]}'),
    "prompt_too_long": _post("/v1/completions", json.dumps({"prompt": [65] * 5000}).encode()),
    "oversized_body": _post("/v1/completions", b'{"prompt": "' + b"x" * (2 << 20) + b'"}'),
    "unknown_route": b"GET /v2/nothing HTTP/1.1\r\nHost: x\r\n\r\n",
    "wrong_method": b"DELETE /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n",
    "garbage": b"\x00\x01GARBAGE \xff\r\n\r\n",
    "crlf_in_field_name": _post("/v1/completions", b'{"prompt": "x", "max_tokens": 2, "a\\r\\nX-Evil: 1": 1}'),
    "long_field_name": _post("/v1/completions", b'{"prompt": "x", "max_tokens": 2, "' + b"k" * 100_000 + b'": 1}'),
    "auth_not_utf8": _post("/v1/completions", b'{"prompt": "x", "max_tokens": 2}', "Authorization: Bearer \xff\xfe\r\n"),
    "tiny_temperature": _post("/v1/completions", b'{"prompt": "x", "max_tokens": 2, "temperature": 1e-39}'),
    "bad_content_length": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
}


async def _exchange(port: int, data: bytes, read: bool = True, limit_s: float = 10.0) -> str:
    """Send raw bytes; the outcome: an HTTP status ('400'), 'closed', 'refused' or 'no_answer'."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), limit_s)
    except (OSError, asyncio.TimeoutError):
        return "refused"
    try:
        writer.write(data)
        await writer.drain()
        if not read:
            return "sent"
        line = await asyncio.wait_for(reader.readline(), limit_s)
        return line.split(b" ")[1].decode() if line.startswith(b"HTTP/1.") else "closed"
    except asyncio.TimeoutError:
        return "no_answer"
    except (ConnectionError, OSError, IndexError):
        return "closed"
    finally:
        writer.transport.abort()


async def _slow_head(port: int) -> str:
    """Half a request head, then silence: the server must close it (--read-timeout 2)."""
    outcome = await _exchange(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", limit_s=8.0)
    return "closed_slow_head" if outcome == "closed" else outcome


async def _cut_body(port: int) -> str:
    return await _exchange(port, _post("/v1/completions", b'{"prompt": "x"}')[:-5], read=False)


async def _dropped_stream(port: int) -> str:
    """A real streamed request abandoned after its first bytes (the KV blocks must be freed)."""
    body = b'{"prompt": "abandoned", "max_tokens": 200, "ignore_eos": true, "stream": true}'
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return "refused"
    try:
        writer.write(_post("/v1/completions", body))
        line = await asyncio.wait_for(reader.readline(), 10)
        return "dropped_" + (line.split(b" ")[1].decode() if line.startswith(b"HTTP/1.") else "closed")
    except (asyncio.TimeoutError, ConnectionError, OSError, IndexError):
        return "dropped_closed"
    finally:
        writer.transport.abort()


async def send_malformed(port: int, stop: asyncio.Event, outcomes: Counter, interval_s: float) -> None:
    kinds = [*MALFORMED, "slow_head", "cut_body", "dropped_stream"]
    pending: set[asyncio.Task] = set()
    i = 0
    while not stop.is_set():
        kind = kinds[i % len(kinds)]
        i += 1
        if kind == "slow_head":
            coro = _slow_head(port)
        elif kind == "cut_body":
            coro = _cut_body(port)
        elif kind == "dropped_stream":
            coro = _dropped_stream(port)
        else:
            coro = _exchange(port, MALFORMED[kind])
        task = asyncio.create_task(coro)
        task.add_done_callback(lambda t, k=kind: outcomes.update([(k, t.result())]))
        pending.add(task)
        task.add_done_callback(pending.discard)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
    if pending:
        await asyncio.wait(pending)


# ---- faults -------------------------------------------------------------------------------------

async def inject_faults(server: Server, proxy: Proxy, stop: asyncio.Event, every_s: float,
                        injected: Counter, say: Callable[[str], None]) -> None:
    i = 0
    while True:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)
        if stop.is_set():
            return
        if not server.ready or server.proc.poll() is not None:
            continue  # still restarting from the last one
        fault = FAULTS[i % len(FAULTS)]
        i += 1
        if fault == "kill_server":
            server.proc.kill()
        elif fault == "term_server":
            server.proc.send_signal(signal.SIGTERM)
        elif fault == "kill_engine":
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.engine_pid, signal.SIGKILL)
        else:
            say(f"dropped {proxy.drop_all()} connections")
        injected[fault] += 1
        say(f"fault: {fault}")


# ---- the run ------------------------------------------------------------------------------------

async def run(args: argparse.Namespace, work: Path, say: Callable[[str], None]) -> dict:
    server = Server(free_port(), work, say)
    await asyncio.to_thread(server.start)
    proxy = Proxy(server.port, args.backend_wait)
    proxy_port = await proxy.start()
    out, per_request = work / "out", work / "requests.jsonl"
    replay = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadgen.cli", "replay", "--url", f"http://127.0.0.1:{proxy_port}",
        "--conc", str(args.conc), "--duration", str(args.duration), "--timeout", str(args.timeout),
        "--seed", str(args.seed), "--out", str(out), "--per-request", str(per_request), *REPLAY_FLAGS,
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    say(f"replay started: conc {args.conc}, window {args.duration:g} s, server on port {server.port}, "
        f"proxy on {proxy_port}")
    stop = asyncio.Event()
    injected: Counter = Counter()
    malformed: Counter = Counter()
    helpers = [asyncio.create_task(server.supervise(stop)),
               asyncio.create_task(inject_faults(server, proxy, stop, args.fault_every, injected, say)),
               asyncio.create_task(send_malformed(server.port, stop, malformed, args.malformed_every))]
    started = time.monotonic()
    try:
        _, stderr = await asyncio.wait_for(replay.communicate(), args.duration + args.timeout + 120)
    except asyncio.TimeoutError:
        replay.kill()
        _, stderr = await replay.communicate()
    elapsed = time.monotonic() - started
    stop.set()
    await asyncio.gather(*helpers)
    final_exit = await asyncio.to_thread(server.stop)
    await proxy.close()
    report = account(per_request, out / "result.json", proxy)
    report.update(
        replay_exit_code=replay.returncode, replay_stderr=stderr.decode(errors="replace").strip()[-2000:],
        replay_wall_s=round(elapsed, 1), faults=dict(injected), connections_dropped=proxy.dropped,
        proxy_gave_up_on_backend=proxy.refused_connections, server_starts=server.starts,
        server_exit_codes={str(k): v for k, v in server.exit_codes.items()}, final_server_exit_code=final_exit,
        malformed=_malformed_summary(malformed),
    )
    return report


def account(per_request: Path, results: Path, proxy: Proxy) -> dict:
    """Sent (ids the proxy saw) against the per-request records and the results file."""
    records = [json.loads(line) for line in per_request.read_text().splitlines()] if per_request.exists() else []
    recorded = {r["id"] for r in records}
    failed = Counter(r["error"] for r in records if r["error"] is not None)
    report = {
        "sent": len(proxy.request_ids),
        "recorded": len(records),
        "completed": sum(1 for r in records if r["error"] is None),
        "failed_by_kind": dict(failed),
        "lost": len(proxy.request_ids - recorded),
        "failed_before_the_wire": len(recorded - proxy.request_ids),
    }
    report["results_file"], report["results_complete"] = _check_results(results, records)
    return report


def _check_results(path: Path, records: list[dict]) -> tuple[str, bool]:
    try:
        doc = read_results(path)
    except ResultsError as exc:
        return str(exc), False
    counts = [level["counts"] for level in doc["levels"]]
    counted = sum(c["requests_ok"] + c["errors_total"] + c["warmup_requests_ok"] + sum(c["warmup_errors"].values())
                  for c in counts)
    # A request cancelled when its level stopped has a record, and a count only if it was in
    # the window: compare without the cancelled ones.
    cancelled_counted = sum(c["errors"].get("cancelled", 0) for c in counts)
    cancelled_records = sum(1 for r in records if r["error"] == "cancelled")
    complete = doc["status"] == "complete" and counted - cancelled_counted == len(records) - cancelled_records
    return f"{path}: status {doc['status']}, {len(doc['levels'])} level(s), {counted} requests counted", complete


def _malformed_summary(outcomes: Counter) -> dict:
    by_outcome: Counter = Counter()
    for (_, outcome), n in outcomes.items():
        by_outcome[outcome] += n
    statuses = Counter()
    for outcome, n in by_outcome.items():
        statuses[outcome.removeprefix("dropped_")] += n
    server_errors = sum(n for status, n in statuses.items() if status.startswith("5") and status != "503")
    return {"sent": sum(outcomes.values()), "by_outcome": dict(sorted(by_outcome.items())),
            "by_kind": {f"{k}: {o}": n for (k, o), n in sorted(outcomes.items())},
            "server_errors_other_than_503": server_errors}


# Broken servers (the test streaming server's fault modes): what each must be counted as, never as ok.
SSE_SERVER = ROOT / "tests" / "loadgen" / "sse_server.py"
BROKEN = {
    "reset_midstream": ({"fault": {"kind": "reset", "every": 2}}, "reset"),
    "http_500": ({"fault": {"kind": "500", "every": 2}}, "http_500"),
    "one_token_short": ({"fault": {"kind": "short", "every": 2}}, "truncated"),
    "token_ids_as_text": ({"token_ids_as_text": True}, "protocol"),
    "more_tokens_than_asked": ({"extra_tokens": 8}, "protocol"),
    "usage_completion_1e30": ({"usage_completion_tokens": 1e30}, "protocol"),
    "cached_tokens_negative": ({"cached_tokens": -100}, "protocol"),
}


def broken_servers(work: Path, say: Callable[[str], None]) -> dict:
    """Replay against a server of each broken kind: every request the server saw is in the per-request
    file (0 lost), and each fault is counted under its kind."""
    report = {}
    for name, (config, kind) in BROKEN.items():
        proc = subprocess.Popen([sys.executable, str(SSE_SERVER), "--config",
                                 json.dumps({"first_ms": 2, "itl_ms": 1, **config})],
                                stdout=subprocess.PIPE, text=True)
        try:
            url = f"http://127.0.0.1:{proc.stdout.readline().split()[1]}"
            out, per_request = work / f"broken-{name}", work / f"broken-{name}.jsonl"
            code = subprocess.run([sys.executable, "-m", "loadgen.cli", "replay", "--url", url, "--conc", "2",
                                   "--duration", "2", "--timeout", "5", "--out", str(out), "--per-request",
                                   str(per_request), *REPLAY_FLAGS], cwd=ROOT, capture_output=True).returncode
            with urllib.request.urlopen(url + "/_records", timeout=10) as resp:
                seen = {r["id"] for r in json.loads(resp.read())["records"]}
        finally:
            proc.kill()
            proc.wait()
        records = [json.loads(line) for line in per_request.read_text().splitlines()] if per_request.exists() else []
        counts = read_results(out / "result.json")["levels"][0]["counts"]
        report[name] = {"server_saw": len(seen), "lost": len(seen - {r["id"] for r in records}),
                        "errors": counts["errors"], "ok": counts["requests_ok"], "expected_kind": kind,
                        "counted_as_expected": counts["errors"].get(kind, 0) > 0, "replay_exit_code": code}
        say(f"broken server {name}: {report[name]}")
    return report


def print_report(report: dict) -> None:
    print(f"requests sent {report['sent']}, completed {report['completed']}, "
          f"failed {sum(report['failed_by_kind'].values())} {report['failed_by_kind']}, lost {report['lost']}")
    print(f"failed before reaching the wire: {report['failed_before_the_wire']}")
    print(f"results file complete: {report['results_complete']} ({report['results_file']})")
    print(f"faults: {report['faults']}; connections dropped {report['connections_dropped']}; "
          f"server starts {report['server_starts']}, exit codes {report['server_exit_codes']}")
    malformed = report["malformed"]
    print(f"malformed requests: {malformed['sent']} sent, outcomes {malformed['by_outcome']}, "
          f"5xx other than 503: {malformed['server_errors_other_than_503']}")
    print(f"replay exit code {report['replay_exit_code']} after {report['replay_wall_s']} s")
    for name, row in report.get("broken_servers", {}).items():
        print(f"broken server {name}: saw {row['server_saw']}, lost {row['lost']}, ok {row['ok']}, "
              f"errors {row['errors']} (expected kind {row['expected_kind']}: "
              f"{'counted' if row['counted_as_expected'] else 'NOT COUNTED'})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=150.0, help="replay window in seconds (default 150)")
    parser.add_argument("--conc", type=int, default=4, help="replay concurrency (default 4)")
    parser.add_argument("--timeout", type=float, default=30.0, help="loadgen's per-request --timeout (default 30)")
    parser.add_argument("--fault-every", type=float, default=12.0, metavar="S", help="seconds between faults (default 12)")
    parser.add_argument("--malformed-every", type=float, default=0.25, metavar="S",
                        help="seconds between malformed requests (default 0.25)")
    parser.add_argument("--backend-wait", type=float, default=20.0, metavar="S",
                        help="how long the proxy waits for a restarting server before closing a client (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="replay seed (default 0)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, results)")
    parser.add_argument("--quiet", action="store_true", help="only the report")
    args = parser.parse_args(argv)
    for name in ("duration", "timeout", "fault_every", "malformed_every", "backend_wait"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')}: must be > 0")
    say = (lambda text: None) if args.quiet else (lambda text: print(f"[{time.strftime('%H:%M:%S')}] {text}",
                                                                     file=sys.stderr, flush=True))
    with tempfile.TemporaryDirectory(prefix="agentload-chaos-") as tmp:
        work = Path(tmp)
        report = asyncio.run(run(args, work, say))
        report["broken_servers"] = broken_servers(work, say)
        print_report(report)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        if args.keep:
            kept = Path(tempfile.mkdtemp(prefix="agentload-chaos-kept-"))
            subprocess.run(["cp", "-r", f"{work}/.", str(kept)], check=True)
            print(f"work folder kept in {kept}")
    broken = report["broken_servers"].values()
    ok = (report["lost"] == 0 and report["results_complete"] and report["malformed"]["server_errors_other_than_503"] == 0
          and all(row["lost"] == 0 and row["counted_as_expected"] for row in broken))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
