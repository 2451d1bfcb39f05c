"""--ray: worker actors on a Ray cluster, merged like local worker processes (`agentload[ray]`)."""

from __future__ import annotations

import sys

import pytest

pytestmark = pytest.mark.slow  # tens of seconds: scheduled first (tests/conftest.py)


def test_ray_actors_merge_their_shares(start_server, sessions, replay):
    """`--ray auto` with no cluster running starts a local Ray head (2 CPUs here) for the run and
    places the two workers on it as actors; the merged counts match what the server saw."""
    pytest.importorskip("ray", reason="the `ray` extra is not installed")
    server = start_server(first_ms=3, itl_ms=1)
    folder = sessions(*({"n_requests": 8, "think": 0.01, "n_out": 4} for _ in range(4)))
    code, doc, records = replay(server.url, "--traces", str(folder), "--conc", "4", "--duration", "1",
                                "--warmup", "1req", "--workers", "2", "--ray", "auto")
    assert code == 0, doc["message"]
    level = doc["levels"][0]
    counted = [r for r in records if r["counted"]]
    assert len(server.records()["records"]) == len(records)
    assert len(counted) == level["counts"]["requests_ok"] == level["metrics"]["ttft"]["stats"]["count"] > 0
    assert level["counts"]["output_tokens"] == sum(r["osl"] for r in counted)
    assert {r["id"].rsplit("-", 1)[1].split(".")[0] for r in records} == {"0", "1"}


def test_without_ray_the_flag_says_how_to_install_it(start_server, sessions, replay_cli_error, monkeypatch):
    server = start_server()
    folder = sessions({"n_requests": 3, "think": 0.0, "n_out": 2})
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "loadgen.run.ray_pool", raising=False)
    code, err = replay_cli_error("--url", server.url, "--traces", str(folder), "--ray", "auto", "--workers", "2")
    assert code == 2 and "pip install agentload[ray]" in err
