"""The real server over HTTP: both endpoints streaming and not, usage, token ids, determinism,
prefix-cache hits, disconnects freeing blocks, a small KV pool under concurrency, /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time

import orjson

from tests.server.conftest import API_KEY, REPO

BLOCK = 16  # the tiny preset's default block size


def _ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


async def _wait_idle(server, timeout_s: float = 60.0) -> dict:
    """Poll /metrics until the engine reports no running request and no KV block in use."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = await server.metrics()
        label = (("model_name", server.model),)
        state = {name: samples[(name, label)] for name in (
            "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")}
        if not any(state.values()) or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.05)


def test_models_and_health(server):
    status, body, _ = asyncio.run(server.request("GET", "/v1/models"))
    assert status == 200 and body["object"] == "list"
    (card,) = body["data"]
    assert card["id"] == server.model == "tiny"
    assert card["owned_by"] == "agentload"
    assert (card["max_model_len"], card["num_gpus"], card["vocab_size"]) == (1024, 0, 1024)
    launch = card["launch"]  # how it was started, for results to record: its key replaced by ***
    assert launch["argv"][:4] == [sys.executable, "-m", "server.cli", "start"]
    assert launch["argv"][launch["argv"].index("--api-key") + 1] == "***" and API_KEY not in orjson.dumps(card).decode()
    assert launch["cwd"] == str(REPO) and {"torch", "aiohttp"} <= set(launch["versions"]["packages"])
    assert all(not name.endswith("KEY") for name in launch["env"])
    status, health, _ = asyncio.run(server.request("GET", "/health", headers={"Authorization": ""}))
    assert status == 200 and health["status"] == "ok" and health["engine_pid"] == server.engine_pid


def test_completion_exact_max_tokens_and_usage(server):
    status, body = asyncio.run(server.post("/v1/completions", {
        "model": "tiny", "prompt": "hello world", "max_tokens": 23, "ignore_eos": True}))
    assert status == 200, body
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "length"
    assert len(choice["token_ids"]) == 23
    assert choice["text"] == bytes(t for t in choice["token_ids"] if t < 256).decode("utf-8", "replace")
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 23, "total_tokens": 34,
                             "prompt_tokens_details": {"cached_tokens": 0}}


def test_completion_stream_with_usage(server):
    prompt = _ids(40, seed=1)
    events = asyncio.run(server.stream("/v1/completions", {
        "prompt": prompt, "max_tokens": 17, "ignore_eos": True,
        "stream_options": {"include_usage": True}}))
    assert events[-1] == "[DONE]"
    usage_chunk, chunks = events[-2], events[:-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["prompt_tokens"] == 40
    assert usage_chunk["usage"]["completion_tokens"] == 17
    assert all(c["object"] == "text_completion" and c["usage"] is None for c in chunks)
    token_ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert len(token_ids) == 17
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert len({c["id"] for c in chunks}) == 1


def test_stream_without_include_usage_has_no_usage(server):
    events = asyncio.run(server.stream("/v1/completions", {"prompt": "abc", "max_tokens": 4,
                                                           "ignore_eos": True}))
    assert events[-1] == "[DONE]"
    assert all("usage" not in e for e in events[:-1])
    assert sum(len(e["choices"][0]["token_ids"]) for e in events[:-1]) == 4


def test_chat_completion_and_stream(server):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    # BOS + "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    prompt_tokens = 1 + len("<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n")
    status, body = asyncio.run(server.post("/v1/chat/completions", {
        "model": "tiny", "messages": messages, "max_tokens": 9, "ignore_eos": True, "temperature": 0}))
    assert status == 200, body
    assert body["object"] == "chat.completion"
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert len(choice["token_ids"]) == 9 and choice["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == prompt_tokens
    assert body["usage"]["completion_tokens"] == 9

    events = asyncio.run(server.stream("/v1/chat/completions", {
        "model": "tiny", "messages": messages, "max_tokens": 9, "ignore_eos": True, "temperature": 0,
        "stream_options": {"include_usage": True}}))
    chunks = events[:-2]
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 9
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    streamed = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert streamed == choice["token_ids"]  # greedy: same tokens streamed or not
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == choice["message"]["content"]


def test_greedy_is_deterministic_and_seeded_sampling_repeats(server):
    async def twice(body):
        return await asyncio.gather(*(server.post("/v1/completions", body) for _ in range(2)))

    greedy = asyncio.run(twice({"prompt": _ids(30, 2), "max_tokens": 8, "ignore_eos": True,
                                "temperature": 0}))
    assert greedy[0][1]["choices"][0]["token_ids"] == greedy[1][1]["choices"][0]["token_ids"]
    seeded = asyncio.run(twice({"prompt": _ids(30, 3), "max_tokens": 8, "ignore_eos": True,
                                "temperature": 1.0, "top_p": 0.9, "seed": 7}))
    assert seeded[0][1]["choices"][0]["token_ids"] == seeded[1][1]["choices"][0]["token_ids"]


def test_token_id_prompt_with_special_ids(server):
    status, body = asyncio.run(server.post("/v1/completions", {
        "prompt": [256, *_ids(20, 4)], "max_tokens": 8, "ignore_eos": True}))
    assert status == 200, body
    assert len(body["choices"][0]["token_ids"]) == 8
    assert body["usage"]["prompt_tokens"] == 21


def test_repeated_prefix_reports_cached_tokens(server):
    prompt = _ids(10 * BLOCK + 5, seed=5)

    async def go():
        first = await server.post("/v1/completions", {"prompt": prompt, "max_tokens": 2})
        second = await server.post("/v1/completions", {"prompt": prompt + [7, 8, 9], "max_tokens": 2})
        return first, second

    (s1, first), (s2, second) = asyncio.run(go())
    assert s1 == s2 == 200
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == 10 * BLOCK  # every full block of the shared prefix


def test_disconnect_mid_stream_frees_every_block(server):
    async def go():
        generated = await server.metric("vllm:generation_tokens_total")
        async with server.session() as session:
            body = {"prompt": _ids(100, 6), "max_tokens": 500, "ignore_eos": True, "stream": True}
            async with session.post(server.url + "/v1/completions", data=orjson.dumps(body)) as resp:
                assert resp.status == 200
                seen = 0
                async for line in resp.content:
                    seen += line.startswith(b"data: ")
                    if seen == 3:
                        break
            # Leaving the block closes the connection with ~497 tokens still to go.
        state = await _wait_idle(server)
        return state, await server.metric("vllm:generation_tokens_total") - generated

    state, generated = asyncio.run(go())
    assert state == {"vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0,
                     "vllm:kv_cache_usage_perc": 0.0}
    assert generated < 500, "the request ran to the end instead of being aborted"
    status, body = asyncio.run(server.post("/v1/completions", {"prompt": "still here", "max_tokens": 3}))
    assert status == 200, body


def test_disconnect_while_waiting_for_a_full_response_frees_every_block(server):
    async def go():
        generated = await server.metric("vllm:generation_tokens_total")
        body = {"prompt": _ids(100, 8), "max_tokens": 500, "ignore_eos": True}
        pending = asyncio.create_task(server.post("/v1/completions", body))
        while not await server.metric("vllm:num_requests_running"):  # until the engine runs it
            await asyncio.sleep(0.01)
        pending.cancel()  # closes the connection with the request unfinished
        with contextlib.suppress(asyncio.CancelledError):
            await pending
        state = await _wait_idle(server)
        return state, await server.metric("vllm:generation_tokens_total") - generated

    state, generated = asyncio.run(go())
    assert state == {"vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0,
                     "vllm:kv_cache_usage_perc": 0.0}
    assert generated < 500, "the request ran to the end instead of being aborted"


def test_small_kv_pool_many_concurrent_requests_all_complete(server):
    """The shared server's pool (--kv-cache-gb 0.0005: 43 blocks of 16 tokens) holds fewer than
    the 8 requests x 7 blocks sent at once: the engine must queue and preempt, never lose one."""

    async def one(i: int):
        body = {"prompt": _ids(80 + i, 100 + i), "max_tokens": 24, "ignore_eos": True}
        if i % 2:
            events = await server.stream("/v1/completions", body)
            assert events[-1] == "[DONE]"
            return [t for e in events[:-1] for t in e["choices"][0]["token_ids"]]
        status, resp = await server.post("/v1/completions", body)
        assert status == 200, resp
        return resp["choices"][0]["token_ids"]

    async def go():
        before = await server.metric("vllm:num_preemptions_total")
        outputs = await asyncio.gather(*(one(i) for i in range(8)))
        return before, await server.metric("vllm:num_preemptions_total"), outputs

    before, after, outputs = asyncio.run(go())
    assert [len(o) for o in outputs] == [24] * 8
    assert after > before, "the pool was meant to be too small for all requests at once"
    assert asyncio.run(_wait_idle(server))["vllm:kv_cache_usage_perc"] == 0.0


def test_metrics_counters_move(server):
    async def go():
        before = await server.metrics()
        status, _ = await server.post("/v1/completions", {"prompt": _ids(33, 9), "max_tokens": 5,
                                                          "ignore_eos": True})
        assert status == 200
        await _wait_idle(server)
        return before, await server.metrics()

    before, after = asyncio.run(go())
    label = (("model_name", server.model),)

    def delta(name, labels=label):
        return after[(name, labels)] - before.get((name, labels), 0)

    assert delta("vllm:prompt_tokens_total") == 33
    assert delta("vllm:generation_tokens_total") == 5
    assert delta("vllm:prefix_cache_queries_total") >= 33
    assert delta("vllm:time_to_first_token_seconds_count") == 1
    assert delta("vllm:inter_token_latency_seconds_count") == 4  # one token per step here
    assert delta("vllm:e2e_request_latency_seconds_count") == 1
    assert delta("vllm:request_success_total", (("finished_reason", "length"), *label)) == 1
    status, text, headers = asyncio.run(server.request("GET", "/metrics", headers={"Authorization": ""}))
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")



def test_min_tokens_holds_back_eos_without_crashing_the_engine(server):
    status, body = asyncio.run(server.post("/v1/completions", {
        "prompt": _ids(20, 10), "max_tokens": 12, "min_tokens": 12}))
    assert status == 200, body
    assert len(body["choices"][0]["token_ids"]) == 12
