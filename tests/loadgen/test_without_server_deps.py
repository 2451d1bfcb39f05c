"""The load generator alone: `pip install agentload` brings no torch, triton, aiohttp or safetensors
(they are the `server` extra, pyproject.toml), so loadgen must import and replay without them, and
the commands that run the engine must say in one line what to install.

Each command runs in a subprocess whose `sitecustomize` makes those packages unimportable, against
the real streaming server of tests/loadgen/sse_server.py (started outside the block: it is aiohttp).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from server.extra import SERVER_EXTRA

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("torch", "triton", "aiohttp", "safetensors")
BLOCKER = f'''
import sys

class BlockServerDeps:
    """Any import of the server's dependencies fails, as where they were never installed."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {SERVER_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
        return None

sys.meta_path.insert(0, BlockServerDeps())
'''


@pytest.fixture
def blocked_env(tmp_path) -> dict[str, str]:
    """An environment whose Python cannot import the server's dependencies."""
    site = tmp_path / "block"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}


def _loadgen(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loadgen.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_block_holds(blocked_env):
    for name in SERVER_ONLY:
        result = subprocess.run([sys.executable, "-c", f"import {name}"], env=blocked_env,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and "(blocked)" in result.stderr, name


@pytest.mark.parametrize("args", [["--help"], ["replay", "--help"]])
def test_help_without_server_deps(blocked_env, args):
    result = _loadgen(blocked_env, *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: loadgen")


def test_replay_and_report_without_server_deps(blocked_env, start_server, tmp_path):
    server = start_server(itl_ms=1.0)
    out = tmp_path / "run"
    result = _loadgen(blocked_env, "replay", "--url", server.url, "--conc", "1", "--duration", "2",
                      "--token-scale", "0.02", "--think-time-scale", "0.01", "--think-time-cap", "1",
                      "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "== conc 1:" in result.stdout and "TTFT" in result.stdout
    assert server.records()["records"], "no request reached the server"
    report = _loadgen(blocked_env, "report", str(out / "result.json"))
    assert report.returncode == 0, report.stderr
    assert "conc 1" in report.stdout


@pytest.mark.parametrize("command", [["loadgen.cli", "bench", "--duration", "1"], ["server.cli", "start"],
                                     ["server.parallel", "--help"]])
def test_the_engine_without_server_deps_names_the_extra(blocked_env, command):
    result = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, env=blocked_env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "torch is not installed" in lines[0] and "pip install 'agentload[server]'" in lines[0]


def test_the_base_install_leaves_the_server_deps_to_its_extra():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {dep.split(">")[0].split(";")[0].split("=")[0].strip() for dep in project["dependencies"]}
    assert not names & set(SERVER_ONLY)
    server_extra = " ".join(project["optional-dependencies"]["server"])
    assert all(name in server_extra for name in SERVER_ONLY)
    assert "agentload[server]" in project["optional-dependencies"]["test"]
    assert set(SERVER_EXTRA) == set(SERVER_ONLY)
