"""The `server` command: `server start` serves the sparse-MLA engine over an OpenAI-compatible API.

Lifecycle: build the engine in its own process (blocking until it is ready), serve HTTP, print
one `ready` line with the URL on stderr. SIGTERM/SIGINT start one drain with one deadline: new
requests get 503, running ones may finish within --shutdown-timeout seconds; at the deadline (or
at a second signal) each one still running is cut with an error event, `[DONE]` and a proper end
of its body (see server/api.py); then the engine stops. If the engine process dies, requests get
503 and /health fails for a short grace period, then the server exits.

Exit codes: 0 stopped by a signal and every running request finished; 1 the engine died or the
address could not be bound; 2 bad flags or configuration, or a package of the server extra
(server/extra.py) not installed; 3 stopped by a signal and requests were cut at the deadline (their
number is on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.config import HttpConfig

ENGINE_DEATH_GRACE_S = 2.0  # keep answering 503 (not connection refused) this long, then exit
EXIT_REQUESTS_CUT = 3


def build_parser() -> argparse.ArgumentParser:
    from server.args import add_engine_args, add_http_args

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
    add_http_args(start)
    add_engine_args(start)
    start.set_defaults(func=start_command)
    return parser


def start_command(args: argparse.Namespace) -> int:
    from server.args import engine_config_from_args, http_config_from_args
    from server.engine_client import EngineClient, EngineStartError
    from server.log import configure_logging

    try:
        http = http_config_from_args(args)
        api_key = http.read_api_key()
        config = engine_config_from_args(args)
        configure_logging()
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
        return _run(_serve(http, api_key, client, info))
    finally:
        client.shutdown()


def _run(coro) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def _serve(http: HttpConfig, api_key: str | None, client, info) -> int:
    from aiohttp import web

    from server.api import CUT_WRITE_GRACE_S, ApiSettings, OpenAIServer
    from server.connections import AppRunner
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
        served_model_name=http.served_model_name or info.model_name,
        api_key=api_key,
        max_body_bytes=http.max_body_bytes,
        max_queue=http.max_queue,
        max_num_seqs=client.config.scheduler.max_num_seqs,
        read_timeout_s=http.read_timeout,
    )
    server = OpenAIServer(client, info, settings,
                          ByteTokenizer(info.vocab_size, model.bos_token_id, info.eos_token_id))
    # keepalive_timeout bounds the wait for a complete request head (see server/api.py) and
    # lingering_time the rest of a body after its 408; the drain below ends every handler, so
    # cleanup's own timeout only covers writes stuck on clients that stopped reading.
    runner = AppRunner(server.build_app(), on_rejected=server.metrics.observe_rejected, handler_cancellation=True,
                       access_log=None,
                       keepalive_timeout=http.read_timeout, lingering_time=http.read_timeout,
                       shutdown_timeout=CUT_WRITE_GRACE_S)
    await runner.setup()
    try:
        await web.TCPSite(runner, http.host, http.port).start()
    except OSError as exc:
        print(f"server start: error: cannot bind {http.host}:{http.port}: {exc}", file=sys.stderr)
        await runner.cleanup()
        return 1
    # aiohttp and the app are long-lived objects: frozen, a full collection does not walk them while
    # requests stream (it would stall every stream at once)
    gc.collect()
    gc.freeze()
    host, port = runner.addresses[0][:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    print(f"server: ready at {url} (model {settings.served_model_name}, engine pid {info.pid})",
          file=sys.stderr, flush=True)
    code, reason = await done
    print(f"server: {reason}; draining (running requests: {server.in_flight}, up to "
          f"{http.shutdown_timeout:g} s)", file=sys.stderr, flush=True)
    cut = await server.drain(http.shutdown_timeout, cut_now)
    await runner.cleanup()
    if client.dead_reason is not None:
        code = 1
    elif cut:
        when = "at a second signal" if cut_now.is_set() else "at the shutdown deadline"
        print(f"server: {cut} running requests were cut {when}", file=sys.stderr, flush=True)
        code = EXIT_REQUESTS_CUT
    print(f"server: stopped (exit code {code})", file=sys.stderr, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    from server.extra import exit_missing_extra

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:
        return exit_missing_extra(exc, f"server {args.command}")


if __name__ == "__main__":
    sys.exit(main())
