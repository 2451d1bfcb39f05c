"""loadgen's speculative-decoding side against the streaming test server (not ours): the expected
AL per request from a golden curve (thinking auto with one fallback warning, clear errors), never
sent to a foreign server; measured AL from /metrics deltas; TPOT, ITL and tokens per chunk when a
chunk carries several tokens."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from loadgen.results.metrics import decode_histogram
from loadgen.run.spec_decode import SpecCounters, parse_spec_counters
from loadgen.telemetry.server_counters import ServerCounters, parse_server_counters
from tests.loadgen.conftest import request_item


def _traces(folder: Path, n_out: int = 10, sessions: int = 2) -> Path:
    """Sessions whose requests alternate thinking and plain text outputs."""
    for s in range(sessions):
        items = [request_item(i * 0.1, 200 + 70 * i, n_out, 0.0, 1) for i in range(4)]
        for i, item in enumerate(items):
            item["output_types"] = ["thinking", "text"] if i % 2 == 0 else ["text"]
        doc = {"id": f"s{s}", "models": ["m"], "block_size": 64, "hash_id_scope": "local",
               "tool_tokens": 0, "system_tokens": 0, "requests": items}
        folder.mkdir(parents=True, exist_ok=True)
        with gzip.open(folder / f"s{s}.json.gz", "wt") as handle:
            json.dump(doc, handle)
    return folder


LOOPBACK_SLACK_NS = 1_000_000
LOAD = ["--conc", "2", "--duration", "1.5", "--warmup", "0s", "--token-scale", "1", "--think-time-scale", "1"]


def test_foreign_server_gets_no_acceptance_length_but_the_expected_al_is_recorded(
        start_server, replay, tmp_path, capsys):
    server = start_server(tokens_per_chunk=3, itl_ms=1.0)
    traces = _traces(tmp_path / "traces")
    # dsv41flash_dspark has only thinking_on at k=5: plain requests fall back to it, with one warning.
    code, doc, records = replay(server.url, "--traces", str(traces), *LOAD,
                                "--golden-al", "dsv41flash_dspark", "--spec-k", "5", "--thinking", "auto")
    assert code == 0
    err = capsys.readouterr().err
    assert err.count("warning: curve 'dsv41flash_dspark' has no thinking_off AL at k=5") == 1, err
    seen = server.records()["records"]
    assert seen and all(rec["acceptance_length"] == "absent" for rec in seen)
    assert {r["thinking"] for r in records} == {True, False}
    assert all(r["expected_al"] == 3.51 for r in records)
    (level,) = doc["levels"]
    spec = level["spec_decode"]
    assert spec["k"] == 5 and spec["golden_al"] == "dsv41flash_dspark" and spec["expected_al"] == 3.51
    assert spec["measured_al"] is None and spec["measured_from"] is None  # no usage, no /metrics
    assert doc["config"]["spec_decode"]["sent_per_request"] is False


def test_measured_al_from_metrics_deltas(start_server, replay, tmp_path):
    # Each finished request adds 4 verify steps and 6 accepted drafts: AL (4 + 6) / 4 = 2.5.
    server = start_server(tokens_per_chunk=2, spec_metrics=[4, 6])
    traces = _traces(tmp_path / "traces")
    code, doc, records = replay(server.url, "--traces", str(traces), *LOAD,
                                "--golden-al", "dsv4_mtp", "--spec-k", "3", "--thinking", "auto")
    assert code == 0
    spec = doc["levels"][0]["spec_decode"]
    assert spec["measured_from"] == "metrics" and spec["measured_al"] == 2.5
    assert spec["num_drafts"] % 4 == 0 and spec["num_accepted_tokens"] == spec["num_drafts"] * 6 // 4
    # dsv4_mtp k=3: thinking_on 2.49, thinking_off 2.97; expected = token-weighted mean over measured requests.
    measured = [r for r in records if r["counted"]]
    for r in records:
        assert r["expected_al"] == (2.49 if r["thinking"] else 2.97)
    weighted = sum(r["expected_al"] * r["osl"] for r in measured) / sum(r["osl"] for r in measured)
    assert spec["expected_al"] == round(weighted, 4)


def test_multi_token_chunks_tpot_itl_and_tokens_per_chunk(start_server, replay, tmp_path):
    # 20 ms between chunks: chunks coalesce in the socket (one kernel stamp) only if the client's
    # loop is that late, which a loaded 2-core machine running tests in parallel does not reach
    server = start_server(tokens_per_chunk=4, itl_ms=20.0, first_ms=2.0)
    traces = _traces(tmp_path / "traces", n_out=10)
    code, doc, records = replay(server.url, "--traces", str(traces), *LOAD)
    assert code == 0
    (level,) = doc["levels"]
    measured = [r for r in records if r["counted"]]
    assert measured and all(r["chunk_tokens"] == [4, 4, 2] and r["osl"] == 10 for r in measured)
    cols = level["requests"]
    seen = {rec["id"]: rec for rec in server.records()["records"]}
    gaps = []
    for i, r in enumerate(measured):
        ttft, e2el = cols["ttft_us"][i], cols["e2el_us"][i]
        assert ttft == (r["first_ns"] - r["due_ns"]) // 1000 and e2el == (r["last_ns"] - r["due_ns"]) // 1000
        # TPOT per token, not per chunk: (E2EL - TTFT) / (OSL - 1) with OSL = 10 tokens in 3 chunks.
        assert cols["tpot_us"][i] == max(1, (e2el - ttft) // 9)
        # The server starts each write 20 ms after the previous one began; a chunk reaches the
        # client's socket while the server writes it (the kernel stamps it), so the client's gap
        # is at least from the end of one write to the start of the next, whatever the load - less
        # LOOPBACK_SLACK_NS: on a busy host the loopback delivery (and its stamp) can run in a
        # deferred softirq after the write returned. Coalesced chunks would share one stamp (a gap
        # near 0), far below this bound.
        writes, written = seen[r["id"]]["writes_ns"], seen[r["id"]]["written_ns"]
        for k in range(2):
            assert writes[k + 1] - writes[k] >= 20_000_000
            gap = r["chunk_ns"][k + 1] - r["chunk_ns"][k]
            assert gap >= writes[k + 1] - written[k] - LOOPBACK_SLACK_NS, (r["id"], k, gap, writes, written)
            gaps.append(gap)
        assert (e2el - ttft) >= (writes[2] - written[0]) // 1000
    n = len(measured)
    tpc = decode_histogram(level["metrics"]["tokens_per_chunk"]["hdr"])
    assert tpc.get_total_count() == 3 * n
    assert tpc.get_count_at_value(4) == 2 * n and tpc.get_count_at_value(2) == n
    assert level["metrics"]["itl"]["stats"]["count"] == 2 * n  # one gap per pair of chunks
    itl = decode_histogram(level["metrics"]["itl"]["hdr"])
    assert itl.get_min_value() == itl.get_lowest_equivalent_value(min(gaps) // 1000)  # the gaps, not per token


@pytest.mark.parametrize("flags, message", [
    (["--golden-al", "dsv4_mtp", "--spec-k", "9"], "has no thinking_on AL at k=9"),
    (["--golden-al", "dsv41flash_dspark", "--spec-k", "3"], "has no thinking_on AL at k=3"),
    (["--golden-al", "dsv41flash_dspark", "--spec-k", "5", "--thinking", "off"], "has no thinking_off AL at k=5"),
    (["--golden-al", "no_such_curve", "--spec-k", "3"], "--golden-al:"),
    # selected by model prefix, InferenceX's way: a thinking mode the curve lacks is an error, not a fallback
    (["--golden-al", "dsv4dspark", "--spec-k", "3"],
     "selected by model 'deepseek-v4-pro-0813', has no thinking_off AL at k=3"),
    (["--golden-al", "dsv4_mtp"], "--spec-k: required with --golden-al"),
    (["--golden-al", "dsv4_mtp", "--spec-k", "0"], "--spec-k: must be >= 1"),
    (["--spec-k", "3"], "--spec-k: only meaningful with --golden-al"),
    (["--thinking", "on"], "--thinking: only meaningful with --golden-al"),
])
def test_bad_spec_flags_exit_2(start_server, replay_cli_error, flags, message):
    server = start_server()
    code, err = replay_cli_error("--url", server.url, "--duration", "1", *flags)
    assert code == 2
    assert message in err, err


def test_model_prefix_selects_a_strict_curve_and_names_keep_the_fallback():
    from loadgen.run.spec_decode import expectation_from_flags

    strict = expectation_from_flags("dsv4dspark", 3, "on", {}, ours=False).describe()
    assert ((strict["golden_al"], strict["al_thinking_on"], strict["al_thinking_off"])
            == ("dsv4-pro-0813-dspark", 3.01, None))
    both = expectation_from_flags("dsv4", 3, None, {}, ours=False).describe()  # auto: the curve has both modes
    assert (both["golden_al"], both["al_thinking_on"], both["al_thinking_off"]) == ("dsv4_mtp", 2.49, 2.97)
    named = expectation_from_flags("dsv4-pro-0813-dspark", 3, None, {}, ours=False).describe()
    assert named["al_thinking_on"] == 3.01 and named["al_thinking_off"] is None  # falls back, with a warning


def test_parse_spec_counters():
    text = ("# HELP x\nvllm:spec_decode_num_drafts_total{model_name=\"a\"} 10.0\n"
            "vllm:spec_decode_num_drafts_total{model_name=\"b\"} 5 1700000000\n"
            "vllm:spec_decode_num_accepted_tokens_total{model_name=\"a\"} 21\n"
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 99\n")
    assert parse_spec_counters(text) == SpecCounters(15, 21)
    assert parse_spec_counters("vllm:spec_decode_num_drafts_total 3\n") is None
    bad_value = "vllm:spec_decode_num_drafts_total x\nvllm:spec_decode_num_accepted_tokens_total 1\n"
    assert parse_spec_counters(bad_value) is None


def test_parse_server_counters():
    """One scrape gives the speculative counters and our server's kernel compiles, each None when
    absent; a value that does not parse spoils the scrape."""
    text = ('vllm:spec_decode_num_drafts_total{model_name="a"} 4\n'
            'vllm:spec_decode_num_accepted_tokens_total{model_name="a"} 6\n'
            'agentload:kernel_compiles_total{model_name="a"} 3\n')
    assert parse_server_counters(text) == ServerCounters(SpecCounters(4, 6), 3)
    assert parse_server_counters("agentload:kernel_compiles_total 0\n") == ServerCounters(None, 0)
    assert parse_server_counters("# nothing\n") == ServerCounters(None, None)
    assert parse_server_counters("agentload:kernel_compiles_total x\n") is None
