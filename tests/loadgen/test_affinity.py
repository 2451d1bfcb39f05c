"""CPU lists and placing child processes on them (loadgen/run/affinity.py), and the recipe keys that
use them: server.cpus and sweep.client_cpus reach the processes a recipe starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from loadgen.cli import main
from loadgen.recipe.schema import RecipeError, recipe_from_dict
from loadgen.run.affinity import CpuListError, format_cpus, parse_cpus, placed_on
from tests.loadgen.conftest import sse_server_command, write_recipe

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU placement is Linux-only")

ALLOWED = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else {0}
FIRST, LAST = min(ALLOWED), max(ALLOWED)


def test_cpu_lists_parse_and_print_in_their_short_form():
    assert parse_cpus(str(FIRST), "x") == {FIRST}
    assert parse_cpus(f"{FIRST},{FIRST}-{FIRST}", "x") == {FIRST}
    assert format_cpus({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert parse_cpus(format_cpus(ALLOWED), "x") == ALLOWED


@pytest.mark.parametrize("text, message", [
    ("a", "--cpus: expected CPU numbers and ranges such as '0' or '2-5,8', got 'a'"),
    ("3-1", "--cpus: '3-1' is not a range of CPU numbers"),
    ("-1", "--cpus: expected CPU numbers"),
    ("100000", "--cpus: CPU 100000 not available here (this process may use"),
])
def test_bad_cpu_lists_name_the_flag(text, message):
    with pytest.raises(CpuListError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_cpus(text, "--cpus")


def _affinity_of_child() -> set[int]:
    out = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                         capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


def test_a_child_started_inside_placed_on_runs_there_and_the_caller_is_restored():
    with placed_on(frozenset({LAST})):
        assert _affinity_of_child() == {LAST}
    assert os.sched_getaffinity(0) == ALLOWED
    with placed_on(None):
        assert _affinity_of_child() == ALLOWED


def _recipe(**keys) -> dict:
    return {"name": "t", "server": {"kind": "ours", **keys.pop("server", {})},
            "sweep": {"conc": [1], **keys.pop("sweep", {})}, "variants": [{"name": "A"}]}


def test_recipe_cpu_keys_are_checked_and_named():
    recipe = recipe_from_dict(_recipe(server={"cpus": FIRST}, sweep={"client_cpus": f"{FIRST}-{LAST}"}))
    assert recipe.server.cpus == str(FIRST) and recipe.sweep.client_cpus == f"{FIRST}-{LAST}"
    with pytest.raises(RecipeError, match="server.cpus: CPU 100000 not available here"):
        recipe_from_dict(_recipe(server={"cpus": "100000"}))
    with pytest.raises(RecipeError, match="sweep.client_cpus: expected CPU numbers"):
        recipe_from_dict(_recipe(sweep={"client_cpus": "zero"}))
    with pytest.raises(RecipeError, match="server.cpus: only for a server the recipe starts"):
        recipe_from_dict({"name": "t", "server": {"kind": "url", "url": "http://127.0.0.1:1", "cpus": "0"},
                          "sweep": {"conc": [1]}, "variants": [{"name": "A"}]})


def test_a_recipe_runs_its_server_and_its_load_on_the_cpus_it_names(tmp_path, sessions):
    folder = sessions(*({"n_requests": 3, "think": 0.0, "n_out": 4} for _ in range(2)))
    seen = tmp_path / "server_cpus.txt"
    # the server writes the CPUs it may use, then serves (its children would inherit the same)
    command = sse_server_command(f"import os; open({str(seen)!r}, 'w').write(str(sorted(os.sched_getaffinity(0))))")
    doc = {"name": "pin", "server": {"kind": "command", "command": command, "health_path": "/v1/models",
                                     "cpus": str(LAST)},
           "workload": {"traces": str(folder)},
           "sweep": {"conc": [1], "duration_s": 0.5, "repeats": 1, "seed": 1, "client_cpus": str(FIRST)},
           "variants": [{"name": "a"}]}
    assert main(["recipe", "run", str(write_recipe(tmp_path, doc)), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert json.loads(seen.read_text()) == [LAST]
    result = json.loads((tmp_path / "out" / "runs" / "a-r1" / "result.json").read_text())
    assert result["config"]["host"]["cpus"] == str(FIRST)
    assert os.sched_getaffinity(0) == ALLOWED
