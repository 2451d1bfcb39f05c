"""A real OpenAI-style streaming server with known timing, for loadgen's tests and benchmark.

Run as its own process: `python sse_server.py --config JSON [--cpu N]` prints `PORT <n>` when
it listens on 127.0.0.1. /v1/completions and /v1/chat/completions stream `max_tokens` tokens:
`first_ms` before the first chunk, `itl_ms` between chunks, `tokens_per_chunk` tokens each
(with `token_ids` when `send_token_ids`), then a usage chunk and [DONE] (in one write; with
`usage_apart` each in its own, `itl_ms` after the one before, as vLLM sends them); with `serial` it
serves one request at a time (a slow server: the others queue). It records, per
request, its own timestamps (time.perf_counter_ns, CLOCK_MONOTONIC: comparable across
processes on Linux), the prompt, the fields asked for, and how many distinct `user`s (session
plays) and requests were in flight at once. GET /_records returns them (`writes_ns`: just before each chunk's
write, `written_ns`: just after).

Speculative decoding as vLLM reports it: with `spec_metrics` = [drafts, accepted] per request,
GET /metrics serves `vllm:spec_decode_num_drafts_total` and `..._num_accepted_tokens_total`
grown by that much per finished request (no per-request usage). Each record says whether the
body carried our extension field `acceptance_length`. With `kernel_compiles` = n, /metrics also
serves our server's `agentload:kernel_compiles_total`, grown by n per finished request. With
`gauges` = a KV-cache size in tokens, /metrics serves the gauges of a busy server (the report's
timeline draws them): vLLM's requests running (streaming) and waiting (before their first chunk),
KV-cache usage (the in-flight requests' prompt and sent tokens over that size), and our server's
`agentload:gpu_power_watts` of two made-up GPUs, 100 W and 90 W plus 20 W per running request.

Faults (`fault`: {"kind", "every"}): on every `every`-th request, "reset" closes the connection
after two chunks, "500" answers HTTP 500, "stall" stops after one chunk and never finishes,
"short" ends the stream cleanly with one token too few.

A server whose speed falls with its load in a known way (for the capacity search's tests): with
`itl_per_user` the gap between chunks is `itl_ms` times the number of distinct users (session
plays) with a request in flight at that moment, as a processor shared among its sessions; with
`itl_per_request`, times the number of requests in flight (an open loop's arrivals share it).
Numbers a broken server reports (loadgen must not believe them): `extra_tokens` streams that many
tokens beyond max_tokens, `token_ids_as_text` sends each chunk's ids as one 1,200-character
string, `usage_completion_tokens` and `cached_tokens` put any value in the usage chunk.
The environment variable SSE_SERVER_CONFIG (a JSON object) overrides --config's keys.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import orjson
from aiohttp import web

DEFAULTS = {"first_ms": 0.0, "itl_ms": 0.0, "tokens_per_chunk": 1, "send_token_ids": True,
            "model": "test-model", "owned_by": "test", "max_model_len": None, "num_gpus": None,
            "vocab_size": None, "fault": None, "keep_prompts": False, "cached_tokens": 0, "serial": False,
            "spec_metrics": None, "usage_apart": False, "kernel_compiles": None,
            "gauges": None, "itl_per_user": False, "itl_per_request": False, "extra_tokens": 0,
            "token_ids_as_text": False, "usage_completion_tokens": None}


class State:
    def __init__(self, config: dict) -> None:
        self.cfg = {**DEFAULTS, **config}
        self.records: list[dict] = []
        self.arrivals = 0
        self.inflight = 0
        self.max_inflight = 0
        self.users: dict[str, int] = {}
        self.max_users = 0
        self.lock = asyncio.Lock()  # "serial": one request at a time, the rest queue
        self.finished = 0
        self.flight: dict[int, dict] = {}  # the in-flight requests' records, by id()


async def models(request: web.Request) -> web.Response:
    cfg = request.app["state"].cfg
    entry = {"id": cfg["model"], "object": "model", "owned_by": cfg["owned_by"]}
    for key in ("max_model_len", "num_gpus", "vocab_size"):
        if cfg[key] is not None:
            entry[key] = cfg[key]
    return web.json_response({"object": "list", "data": [entry]})


async def records(request: web.Request) -> web.Response:
    st = request.app["state"]
    body = {"records": st.records, "max_inflight": st.max_inflight, "max_users": st.max_users,
            "arrivals": st.arrivals}
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def complete(request: web.Request) -> web.StreamResponse:
    received = time.perf_counter_ns()
    st: State = request.app["state"]
    cfg = st.cfg
    body = orjson.loads(await request.read())
    st.arrivals += 1
    number = st.arrivals
    chat = request.path.endswith("chat/completions")
    prompt = body["messages"][0]["content"].split() if chat else body["prompt"]
    user = body.get("user", "")
    rec = {"id": request.headers.get("X-Request-Id"), "received_ns": received, "n_prompt": len(prompt),
           "max_tokens": body.get("max_tokens"), "min_tokens": body.get("min_tokens"),
           "ignore_eos": body.get("ignore_eos"), "stream": body.get("stream"),
           "include_usage": (body.get("stream_options") or {}).get("include_usage"),
           "user": user, "model": body.get("model"), "writes_ns": [], "written_ns": [], "fault": None,
           "authorization": request.headers.get("Authorization"), "x_test": request.headers.get("X-Test"),
           "acceptance_length": body.get("acceptance_length", "absent")}
    if cfg["keep_prompts"]:
        rec["prompt"] = [int(x) for x in prompt]
    st.records.append(rec)
    fault = cfg["fault"]
    kind = fault["kind"] if fault and number % fault["every"] == 0 else None
    rec["fault"] = kind
    if kind == "500":
        return web.json_response({"error": {"message": "injected failure", "code": 500}}, status=500)
    st.inflight += 1
    st.flight[id(rec)] = rec
    st.users[user] = st.users.get(user, 0) + 1
    st.max_inflight = max(st.max_inflight, st.inflight)
    st.max_users = max(st.max_users, len(st.users))
    try:
        if cfg["serial"]:
            async with st.lock:
                return await _stream(request, cfg, body, prompt, rec, kind, chat)
        return await _stream(request, cfg, body, prompt, rec, kind, chat)
    finally:
        st.finished += 1
        st.inflight -= 1
        del st.flight[id(rec)]
        st.users[user] -= 1
        if not st.users[user]:
            del st.users[user]


async def _stream(request, cfg, body, prompt, rec, kind, chat) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    total = body["max_tokens"] - (1 if kind == "short" else 0) + cfg["extra_tokens"]
    per = cfg["tokens_per_chunk"]
    start = time.perf_counter_ns()
    deadline = start + int(cfg["first_ms"] * 1e6)
    sent = 0
    writes = rec["writes_ns"]
    while sent < total:
        await _sleep_until(deadline)
        n = min(per, total - sent)
        choice = {"index": 0, "finish_reason": None}
        if chat:
            choice["delta"] = {"content": "x" * n}
        else:
            choice["text"] = "x" * n
        if cfg["send_token_ids"]:
            choice["token_ids"] = list(range(sent, sent + n))
            if cfg["token_ids_as_text"]:  # a broken server: ids as one string, whose length is no count
                choice["token_ids"] = "x" * 1200
        data = b"data: " + orjson.dumps({"id": "c", "object": "text_completion", "choices": [choice]}) + b"\n\n"
        writes.append(time.perf_counter_ns())
        await resp.write(data)
        rec["written_ns"].append(time.perf_counter_ns())
        sent += n
        if kind == "reset" and len(writes) == 2:
            request.transport.close()
            return resp
        if kind == "stall":
            await asyncio.sleep(3600)
        state = request.app["state"]
        sharing = len(state.users) if cfg["itl_per_user"] else state.inflight if cfg["itl_per_request"] else 1
        deadline = writes[-1] + int(cfg["itl_ms"] * 1e6 * sharing)
    completion = sent if cfg["usage_completion_tokens"] is None else cfg["usage_completion_tokens"]
    usage = {"prompt_tokens": len(prompt), "completion_tokens": completion, "total_tokens": len(prompt) + sent,
             "prompt_tokens_details": {"cached_tokens": cfg["cached_tokens"]}}
    final = b"data: " + orjson.dumps({"id": "c", "object": "text_completion", "choices": [], "usage": usage}) + b"\n\n"
    if cfg["usage_apart"]:
        for data in (final, b"data: [DONE]\n\n"):
            await _sleep_until(deadline)
            await resp.write(data)
            deadline = time.perf_counter_ns() + int(cfg["itl_ms"] * 1e6)
    else:
        await resp.write(final + b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _sleep_until(deadline_ns: int) -> None:
    """Never wakes before the deadline (loop timers count milliseconds and may fire early)."""
    while (delay := (deadline_ns - time.perf_counter_ns()) / 1e9) > 0:
        await asyncio.sleep(max(delay, 0.001))


async def metrics(request: web.Request) -> web.Response:
    st = request.app["state"]
    if st.cfg["spec_metrics"] is None and st.cfg["kernel_compiles"] is None and st.cfg["gauges"] is None:
        raise web.HTTPNotFound()
    text = ""
    if st.cfg["spec_metrics"] is not None:
        drafts, accepted = st.cfg["spec_metrics"]
        text += (f"# TYPE vllm:spec_decode_num_drafts_total counter\n"
                 f'vllm:spec_decode_num_drafts_total{{model_name="m"}} {float(drafts * st.finished)}\n'
                 f'vllm:spec_decode_num_accepted_tokens_total{{model_name="m"}} {float(accepted * st.finished)}\n')
    if st.cfg["kernel_compiles"] is not None:
        text += f'agentload:kernel_compiles_total{{model_name="m"}} {st.cfg["kernel_compiles"] * st.finished}\n'
    if st.cfg["gauges"] is not None:
        text += _gauges(st)
    return web.Response(text=text)


def _gauges(st: State) -> str:
    running = sum(1 for rec in st.flight.values() if rec["writes_ns"])
    tokens = sum(rec["n_prompt"] + len(rec["writes_ns"]) * st.cfg["tokens_per_chunk"] for rec in st.flight.values())
    power = "".join(f'agentload:gpu_power_watts{{gpu="{gpu}"}} {watts + 20.0 * running}\n'
                    for gpu, watts in ((0, 100.0), (1, 90.0)))
    return (f'vllm:num_requests_running{{model_name="m"}} {running}\n'
            f'vllm:num_requests_waiting{{model_name="m"}} {len(st.flight) - running}\n'
            f'vllm:kv_cache_usage_perc{{model_name="m"}} {min(1.0, tokens / st.cfg["gauges"])}\n{power}')


async def serve(config: dict) -> None:
    app = web.Application(client_max_size=1 << 28)
    app["state"] = State(config)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/_records", records)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", config.get("port", 0), backlog=1024)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    print(f"PORT {port}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="{}", help="JSON object overriding the defaults")
    parser.add_argument("--cpu", type=int, help="pin this process to one CPU core")
    args = parser.parse_args()
    if args.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    # a recipe variant's env can change the config: SSE_SERVER_CONFIG overrides --config's keys
    config = {**orjson.loads(args.config), **orjson.loads(os.environ.get("SSE_SERVER_CONFIG", "{}"))}
    try:
        import uvloop
        uvloop.run(serve(config))
    except ImportError:
        asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
