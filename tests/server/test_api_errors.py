"""Every refusal returns its status and an OpenAI-style error body, and the server keeps serving."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

GOOD = {"model": "tiny", "prompt": "ok", "max_tokens": 2}


def _assert_error_body(body, status: int) -> dict:
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    return error


def _still_serving(server) -> None:
    status, body = asyncio.run(server.post("/v1/completions", GOOD))
    assert status == 200, body
    assert len(body["choices"][0]["token_ids"]) >= 1


@pytest.mark.parametrize("path, body, param, code", [
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens", "invalid_value"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "3"}, "max_tokens", "invalid_value"),
    ("/v1/completions", {"prompt": ""}, "prompt", "invalid_value"),
    ("/v1/completions", {"prompt": [1, 2, 1024]}, "prompt", "invalid_value"),
    ("/v1/completions", {"prompt": "x", "n": 2}, "n", "unsupported_option"),
    ("/v1/completions", {"prompt": "x", "best_of": 2}, "best_of", "unsupported_option"),
    ("/v1/completions", {"prompt": "x", "logprobs": 1}, "logprobs", "unsupported_option"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, "temperature", "invalid_value"),
    ("/v1/completions", {"prompt": "x" * 1000, "max_tokens": 100}, "max_tokens", "context_length_exceeded"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 1100}]},
     "messages", "context_length_exceeded"),
    ("/v1/chat/completions", {"messages": []}, "messages", "invalid_value"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True},
     "logprobs", "unsupported_option"),
])
def test_invalid_requests_are_400(server, path, body, param, code):
    status, resp = asyncio.run(server.post(path, body))
    assert status == 400
    error = _assert_error_body(resp, 400)
    assert (error["param"], error["code"]) == (param, code)
    _still_serving(server)


@pytest.mark.parametrize("data", [b"{bad json", b"[]", b""])
def test_invalid_json_is_400(server, data):
    status, resp, _ = asyncio.run(server.request("POST", "/v1/completions", data=data))
    assert status == 400 and _assert_error_body(resp, 400)["code"] == "invalid_json"
    _still_serving(server)


def test_seed_beyond_64_bits_is_400(server):
    data = b'{"prompt": "x", "max_tokens": 2, "seed": 18446744073709551619}'
    status, resp, _ = asyncio.run(server.request("POST", "/v1/completions", data=data))
    assert status == 400 and _assert_error_body(resp, 400)["param"] == "seed"
    _still_serving(server)


@pytest.mark.parametrize("stream", [False, True])
def test_request_larger_than_the_kv_pool_is_refused_by_the_engine(server, stream):
    # 700 + 10 tokens fit the 1024-token context but need 45 blocks of a 43-block pool. Streamed
    # responses wait for the engine's first output before sending headers, so both get a 400.
    status, resp = asyncio.run(server.post("/v1/completions", {"prompt": [65] * 700, "max_tokens": 10,
                                                               "stream": stream}))
    assert status == 400
    error = _assert_error_body(resp, 400)
    assert error["code"] == "engine_refused" and "blocks" in error["message"]
    _still_serving(server)


def test_api_key_missing_or_wrong_is_401(server):
    async def go():
        results = []
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "test-key"}):
            async with aiohttp.ClientSession() as session:
                async with session.post(server.url + "/v1/completions", data=orjson.dumps(GOOD),
                                        headers=headers) as resp:
                    results.append((resp.status, await resp.json()))
            async with aiohttp.ClientSession() as session:
                async with session.get(server.url + "/health") as resp:
                    results.append((resp.status, None))
        return results

    results = asyncio.run(go())
    for status, body in results[0::2]:
        assert status == 401
        assert _assert_error_body(body, 401)["code"] == "invalid_api_key"
    assert all(status == 200 for status, _ in results[1::2])  # /health needs no key
    _still_serving(server)


def test_unknown_route_and_model_are_404(server):
    status, resp, _ = asyncio.run(server.request("GET", "/v1/nothing-here"))
    assert status == 404 and _assert_error_body(resp, 404)["code"] == "not_found"
    status, resp = asyncio.run(server.post("/v1/completions", {**GOOD, "model": "gpt-5"}))
    assert status == 404
    error = _assert_error_body(resp, 404)
    assert (error["param"], error["code"]) == ("model", "model_not_found")
    _still_serving(server)


def test_wrong_method_is_405(server):
    status, resp, headers = asyncio.run(server.request("GET", "/v1/completions"))
    assert status == 405 and _assert_error_body(resp, 405)["code"] == "method_not_allowed"
    assert "POST" in headers["Allow"]
    _still_serving(server)


def test_body_over_max_body_mb_is_413(server):
    # The shared server runs with --max-body-mb 1.
    big = orjson.dumps({**GOOD, "prompt": [65] * 400_000})
    assert len(big) > 2**20
    status, resp, _ = asyncio.run(server.request("POST", "/v1/completions", data=big))
    assert status == 413
    assert _assert_error_body(resp, 413)["code"] == "request_too_large"
    _still_serving(server)


def test_errors_are_counted_in_metrics(server):
    async def go():
        before = await server.metrics()
        await server.post("/v1/completions", {"prompt": ""})
        return before, await server.metrics()

    before, after = asyncio.run(go())
    key = ("agentload:requests_rejected_total", (("code", "invalid_value"), ("model_name", "tiny")))
    assert after[key] == before.get(key, 0) + 1
