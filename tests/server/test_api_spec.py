"""The speculative-decoding extensions over HTTP on a real tiny server: /v1/models `speculative`,
`usage.spec_decode` (streaming and not), the per-request `acceptance_length` override, its
refusals, and that a server without speculation neither reports nor accepts them."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Iterator

import pytest

from tests.server.conftest import ServerProcess, start_server

pytestmark = pytest.mark.slow  # tens of seconds: scheduled first (tests/conftest.py)

SPEC = '{"method": "mtp", "num_speculative_tokens": 3}'


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = start_server(tmp_path_factory, "spec", ["--speculative-config", SPEC, "--golden-al", "dsv4_mtp",
                                                   "--thinking", "on"])
    yield proc
    proc.stop()


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(24)]


def _body(seed: int, n: int, **extra) -> dict:
    return {"prompt": _prompt(seed), "max_tokens": n, "min_tokens": n, "ignore_eos": True, **extra}


def _al(spec: dict) -> float:
    return (spec["num_drafts"] + spec["num_accepted_tokens"]) / spec["num_drafts"]


def test_models_card_names_k_and_default_al(spec_server):
    status, body, _ = asyncio.run(spec_server.request("GET", "/v1/models"))
    assert status == 200
    assert body["data"][0]["speculative"] == {"method": "mtp", "num_speculative_tokens": 3,
                                              "rejection_sample_method": "synthetic",
                                              "synthetic_acceptance_length": 2.49}


def test_usage_spec_decode_non_streaming_and_override(spec_server):
    # dsv4_mtp k=3: thinking_on 2.49 (the server's default), thinking_off 2.97 (sent per request).
    results = {}
    for al in (None, 2.97, 1.0, 4.0):
        extra = {} if al is None else {"acceptance_length": al}
        status, body = asyncio.run(spec_server.post("/v1/completions", _body(1, 300, **extra)))
        assert status == 200, body
        spec = body["usage"]["spec_decode"]
        assert spec["num_draft_tokens"] >= spec["num_accepted_tokens"]
        assert body["usage"]["completion_tokens"] == 300
        results[al] = spec
    assert _al(results[None]) == pytest.approx(2.49, rel=0.08)
    assert _al(results[2.97]) == pytest.approx(2.97, rel=0.08)
    assert results[1.0]["num_accepted_tokens"] == 0
    # Every draft accepted (the last steps may propose fewer than k near max_tokens).
    assert results[4.0]["num_accepted_tokens"] == results[4.0]["num_draft_tokens"] > 0


def test_usage_spec_decode_streaming_matches_chunks(spec_server):
    events = asyncio.run(spec_server.stream("/v1/completions", {
        **_body(2, 120, acceptance_length=4.0), "stream_options": {"include_usage": True}}))
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    chunks = [e for e in events[:-2] if e["choices"] and e["choices"][0]["token_ids"]]
    # Every draft accepted: one token per chunk for the prefill, then k+1 = 4 per verify step.
    spec = usage["spec_decode"]
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == 120
    assert max(len(c["choices"][0]["token_ids"]) for c in chunks) == 4
    assert spec["num_accepted_tokens"] == spec["num_draft_tokens"] > 0
    assert all(e.get("usage") is None for e in events[:-2])


@pytest.mark.parametrize("al, message", [(4.5, r"acceptance_length must be in \[1, 4\]"),
                                         (0.5, "acceptance_length: must be >= 1"),
                                         ("3", "acceptance_length: must be a finite number")])
def test_acceptance_length_out_of_range_is_refused(spec_server, al, message):
    status, body = asyncio.run(spec_server.post("/v1/completions", _body(3, 8, acceptance_length=al)))
    assert status == 400
    assert re.search(message, body["error"]["message"]), body


def test_server_without_speculation(server):
    status, body, _ = asyncio.run(server.request("GET", "/v1/models"))
    assert body["data"][0]["speculative"] is None
    status, body = asyncio.run(server.post("/v1/completions", _body(4, 8)))
    assert status == 200 and "spec_decode" not in body["usage"]
    status, body = asyncio.run(server.post("/v1/completions", _body(4, 8, acceptance_length=2.0)))
    assert status == 400
    assert body["error"]["param"] == "acceptance_length"
    assert "does not run synthetic speculative decoding" in body["error"]["message"]
