"""`loadgen golden-al list|show`: through the real `loadgen` entry point, and the parser on its own."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from golden_al import CurveError, list_curves
from loadgen.cli import golden_al as cmd_golden_al

REPO = Path(__file__).resolve().parents[2]

needs_full_cli = pytest.mark.skipif(
    importlib.util.find_spec("loadgen.cli.traces") is None,
    reason="loadgen.cli also loads loadgen.cli.traces, which is not in the tree yet",
)


def _loadgen(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadgen.cli", "golden-al", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _run_in_process(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    parser = argparse.ArgumentParser(prog="loadgen")
    cmd_golden_al.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["golden-al", *argv])
    assert args.func(args) == 0
    return capsys.readouterr().out


@needs_full_cli
def test_list_names_every_bundled_curve():
    done = _loadgen("list")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["name", "model", "key", "method", "modes", "k"]
    for name in list_curves():
        assert any(line.startswith(f"{name} ") for line in lines), name
    flash = next(line for line in lines if line.startswith("dsv41flash_dspark "))
    assert flash.split()[1:] == ["deepseek-v4.1-flash", "DSpark", "thinking_on", "5"]


@needs_full_cli
def test_show_prints_al_and_min_variance_rates():
    done = _loadgen("show", "dsv41flash_dspark")
    assert done.returncode == 0, done.stderr
    assert "deepseek-v4.1-flash" in done.stdout
    assert "method: DSpark" in done.stdout
    assert any(line.split() == ["5", "3.51"] for line in done.stdout.splitlines())
    assert any(
        line.split() == ["thinking_on", "5", "1.000", "1.000", "0.510", "0.000", "0.000"]
        for line in done.stdout.splitlines()
    )


@needs_full_cli
def test_show_json_by_file_path():
    path = REPO / "golden_al" / "data" / "qwen3.5_mtp.yaml"
    done = _loadgen("show", str(path), "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["model_key"] == "qwen3.5-397b-a17b-nvfp4"
    assert shown["al"]["thinking_off"]["8"] == 4.71
    assert shown["schedule"] == "min-variance"
    assert shown["rates"]["thinking_on"]["3"] == [1.0, 1.0, 0.39]


@needs_full_cli
@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["show", "llama9_mtp"], "unknown curve 'llama9_mtp'"),
        (["show", "dsv4_mtp", "--schedule", "flat"], "unknown schedule 'flat'"),
    ],
)
def test_errors_exit_2_and_name_the_culprit(argv, named):
    done = _loadgen(*argv)
    assert done.returncode == 2
    assert named in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


@needs_full_cli
def test_malformed_file_exits_2_naming_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("m:\n  thinking_on: {1: 7.0}\n")
    done = _loadgen("show", str(path))
    assert done.returncode == 2
    assert str(path) in done.stderr and "m.thinking_on.1" in done.stderr


def test_list_json_in_process(capsys):
    listing = json.loads(_run_in_process(capsys, "list", "--json"))
    assert [entry["name"] for entry in listing] == list_curves()
    dsv4 = next(entry for entry in listing if entry["name"] == "dsv4_mtp")
    assert dsv4 == {
        "name": "dsv4_mtp",
        "model_key": "deepseek-v4-pro",
        "method": "MTP",
        "modes": {"thinking_on": list(range(1, 9)), "thinking_off": list(range(1, 9))},
    }


def test_show_geometric_in_process(capsys):
    shown = json.loads(_run_in_process(capsys, "show", "glm5.2_mtp", "--schedule", "geometric", "--json"))
    rates = shown["rates"]["thinking_on"]["8"]
    assert 1 + sum(rates) == pytest.approx(4.06, abs=1e-9)
    assert rates == sorted(rates, reverse=True)


def test_unknown_curve_in_process_raises_curve_error(capsys):
    with pytest.raises(CurveError, match="unknown curve 'nope'"):
        _run_in_process(capsys, "show", "nope")
