"""The `server` command: `server start` serves the sparse-MLA engine over an OpenAI-compatible API.

Lifecycle: build the engine in its own process (blocking until it is ready), serve HTTP, print
one `ready` line with the URL on stderr. SIGTERM/SIGINT start one drain with one deadline: new
requests get 503, running ones may finish within --shutdown-timeout seconds; at the deadline (or
at a second signal) each one still running is cut with an error event, `[DONE]` and a proper end
of its body (see server/api.py); then the engine stops. If the engine process dies, requests get
503 and /health fails for a short grace period, then the server exits.

Exit codes: 0 stopped by a signal and every running request finished; 1 the engine died or the
address could not be bound; 2 bad flags or configuration; 3 stopped by a signal and requests were
cut at the deadline (their number is on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

ENGINE_DEATH_GRACE_S = 2.0  # keep answering 503 (not connection refused) this long, then exit
EXIT_REQUESTS_CUT = 3


def build_parser() -> argparse.ArgumentParser:
    from server.api import READ_TIMEOUT_S
    from server.config import add_engine_args

    parser = argparse.ArgumentParser(
        prog="server",
        description="OpenAI-compatible server for the sparse-MLA engine (agentload).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    start = subparsers.add_parser(
        "start", help="serve the engine over HTTP",
        description="Serve the engine over an OpenAI-compatible HTTP API: /v1/completions, "
                    "/v1/chat/completions, /v1/models, /health, /metrics.",
    )
    http = start.add_argument_group("HTTP")
    http.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    http.add_argument("--port", type=int, default=8000,
                      help="port to bind; 0 picks a free one, printed on the ready line (default: 8000)")
    http.add_argument("--api-key", default=None,
                      help="require 'Authorization: Bearer KEY' on /v1 routes (default: none)")
    http.add_argument("--max-body-mb", type=float, default=32.0,
                      help="largest request body in MiB; larger ones get 413 (default: 32)")
    http.add_argument("--max-queue", type=int, default=1024,
                      help="requests allowed to wait beyond --max-num-seqs running ones; more get "
                           "503 with Retry-After (default: 1024)")
    http.add_argument("--served-model-name", default=None,
                      help="model id in /v1/models and responses (default: the preset name)")
    http.add_argument("--shutdown-timeout", type=float, default=30.0,
                      help="on SIGTERM/SIGINT, seconds to let running requests finish; then (or at a "
                           "second signal) the rest are cut and the exit code is 3 (default: 30)")
    http.add_argument("--read-timeout", type=float, default=READ_TIMEOUT_S, metavar="S",
                      help="a client must send a complete request head within S seconds of connecting "
                           "(or of its previous response; idle keep-alive connections close then too) "
                           "and its body within S more (else 408, and the connection closes S later at "
                           "most) (default: %(default)g)")
    add_engine_args(start)
    start.set_defaults(func=start_command)
    return parser


def _check_http_args(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port: must be in 0..65535, got {args.port}")
    if args.max_body_mb <= 0:
        raise ValueError(f"--max-body-mb: must be positive, got {args.max_body_mb}")
    if args.max_queue < 0:
        raise ValueError(f"--max-queue: must be >= 0, got {args.max_queue}")
    if args.shutdown_timeout < 0:
        raise ValueError(f"--shutdown-timeout: must be >= 0, got {args.shutdown_timeout}")
    if not args.read_timeout > 0:
        raise ValueError(f"--read-timeout: must be > 0, got {args.read_timeout}")
    if args.api_key == "":
        raise ValueError("--api-key: must not be empty")


def start_command(args: argparse.Namespace) -> int:
    from server.config import engine_config_from_args
    from server.engine_client import EngineClient, EngineStartError

    try:
        _check_http_args(args)
        config = engine_config_from_args(args)
    except ValueError as exc:
        print(f"server start: error: {exc}", file=sys.stderr)
        return 2
    client = EngineClient(config)
    try:
        info = client.start()
    except EngineStartError as exc:
        print(f"server start: error: {exc}", file=sys.stderr)
        return 2 if exc.bad_config else 1
    try:
        return _run(_serve(args, client, info))
    finally:
        client.shutdown()


def _run(coro) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def _serve(args: argparse.Namespace, client, info) -> int:
    from aiohttp import web

    from server.api import CUT_WRITE_GRACE_S, ApiSettings, OpenAIServer
    from server.tokenizer import ByteTokenizer

    loop = asyncio.get_running_loop()
    done: asyncio.Future[tuple[int, str]] = loop.create_future()
    cut_now = asyncio.Event()  # a second signal ends the drain at once

    def finish(code: int, reason: str) -> None:
        if not done.done():
            done.set_result((code, reason))

    def on_signal(sig: signal.Signals) -> None:
        if done.done():
            print(f"server: received {sig.name} again; cutting running requests now", file=sys.stderr, flush=True)
            cut_now.set()
        finish(0, f"received {sig.name}")

    def on_engine_death(reason: str) -> None:
        print(f"server: error: {reason}", file=sys.stderr, flush=True)
        loop.call_later(ENGINE_DEATH_GRACE_S, finish, 1, "the engine process died")

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    client.attach(loop, on_engine_death)

    model = client.config.model
    settings = ApiSettings(
        served_model_name=args.served_model_name or info.model_name,
        api_key=args.api_key,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        max_queue=args.max_queue,
        max_num_seqs=client.config.scheduler.max_num_seqs,
        read_timeout_s=args.read_timeout,
    )
    server = OpenAIServer(client, info, settings,
                          ByteTokenizer(info.vocab_size, model.bos_token_id, info.eos_token_id))
    # keepalive_timeout bounds the wait for a complete request head (see server/api.py) and
    # lingering_time the rest of a body after its 408; the drain below ends every handler, so
    # cleanup's own timeout only covers writes stuck on clients that stopped reading.
    runner = web.AppRunner(server.build_app(), handler_cancellation=True, access_log=None,
                           keepalive_timeout=args.read_timeout, lingering_time=args.read_timeout,
                           shutdown_timeout=CUT_WRITE_GRACE_S)
    await runner.setup()
    try:
        await web.TCPSite(runner, args.host, args.port).start()
    except OSError as exc:
        print(f"server start: error: cannot bind {args.host}:{args.port}: {exc}", file=sys.stderr)
        await runner.cleanup()
        return 1
    host, port = runner.addresses[0][:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    print(f"server: ready at {url} (model {settings.served_model_name}, engine pid {info.pid})",
          file=sys.stderr, flush=True)
    code, reason = await done
    print(f"server: {reason}; draining (running requests: {server.in_flight}, up to "
          f"{args.shutdown_timeout:g} s)", file=sys.stderr, flush=True)
    cut = await server.drain(args.shutdown_timeout, cut_now)
    await runner.cleanup()
    if client.dead_reason is not None:
        code = 1
    elif cut:
        print(f"server: {cut} running requests were cut at the shutdown deadline", file=sys.stderr, flush=True)
        code = EXIT_REQUESTS_CUT
    print(f"server: stopped (exit code {code})", file=sys.stderr, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
