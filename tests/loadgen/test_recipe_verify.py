"""`loadgen recipe verify` on results of real recipe runs (a streaming test server started by the recipe
on 127.0.0.1): results run with a server flag the recipe gives left out are reported naming that
flag, identical ones pass; every run keeps its launch record and its curve's fingerprint, which
InferenceX rows carry; the review's Pareto evidence per curve, and whether a re-run only appended
points."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from loadgen.cli import main
from loadgen.recipe.provenance import recipe_fingerprint
from loadgen.recipe.schema import load_recipe
from tests.loadgen.conftest import write_session

pytestmark = pytest.mark.slow  # several recipe runs

SSE_SERVER = Path(__file__).with_name("sse_server.py")
CONFIG = json.dumps({"port": 0, "first_ms": 3, "itl_ms": 1, "model": "v"}).replace('"port": 0', '"port": {port}')
IMAGE = "example/sse-server:1"


def _recipe(traces: Path, conc: list[int], **server) -> dict:
    return {"name": "v", "server": {"kind": "command", "command": f"{sys.executable} {SSE_SERVER} --config '{CONFIG}'",
                                    "health_path": "/v1/models", "image": IMAGE, **server},
            "workload": {"traces": str(traces)},
            "sweep": {"conc": conc, "duration_s": 0.8, "repeats": 1},
            "variants": [{"name": "a"}]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Recipe files and their results folders: `pinned` gives the server --cpu 0, `plain` leaves it out,
    `more` is plain with one more concurrency run on its own."""
    root = tmp_path_factory.mktemp("verify")
    traces = root / "traces"
    for i in range(4):
        write_session(traces / f"s{i}.json.gz", f"s{i}", n_requests=3, think=0.0, n_out=4)
    docs = {"pinned": _recipe(traces, [1, 2], flags={"cpu": 0}), "plain": _recipe(traces, [1, 2]),
            "more": _recipe(traces, [4])}
    paths = {}
    for name, doc in docs.items():
        recipe = root / f"{name}.yaml"
        recipe.write_text(yaml.safe_dump(doc))
        out = root / f"{name}-out"
        assert main(["recipe", "run", str(recipe), "--out", str(out), "--quiet"]) == 0
        paths[name], paths[f"{name}-out"] = recipe, out
    return paths


def _verify(capsys, *args) -> tuple[int, str]:
    code = main(["recipe", "verify", *map(str, args)])
    return code, capsys.readouterr().out


def test_a_server_flag_left_out_is_named_and_identical_results_pass(runs, capsys):
    code, out = _verify(capsys, runs["pinned"], runs["plain-out"])
    assert code == 1
    assert "server flag --cpu: the recipe gives '0'; the run had none" in out
    assert re.search(r"runs/a-r1/result.json \(variant a, round 1, curve [0-9a-f]{16}\): 1 contradiction\n", out)
    assert "1 of 1 result contradict the recipe" in out
    for name in ("pinned", "plain"):
        code, out = _verify(capsys, runs[name], runs[f"{name}-out"])
        assert code == 0 and "matches the recipe" in out and "all 1 results match the recipe" in out, out


def test_the_launch_record_keeps_what_ran_and_the_curve_fingerprint(runs):
    doc = json.loads((runs["pinned-out"] / "runs" / "a-r1" / "result.json").read_text())
    launch = doc["launch"]
    recipe = load_recipe(str(runs["pinned"]))
    assert launch["recipe_fingerprint"] == recipe_fingerprint(recipe, recipe.baseline)
    assert re.fullmatch(r"[0-9a-f]{64}", launch["recipe_fingerprint"])
    argv = launch["server"]["argv"]
    assert argv[:2] == [sys.executable, str(SSE_SERVER)] and argv[-2:] == ["--cpu", "0"]
    assert launch["server"]["image"] == IMAGE and launch["variant"] == "a" and launch["round"] == 1
    assert launch["load_argv"][3] == "replay" and "--conc" in launch["load_argv"]
    plain = load_recipe(str(runs["plain"]))
    more = load_recipe(str(runs["more"]))
    # points are not the curve: another concurrency list keeps the fingerprint, another flag does not
    assert recipe_fingerprint(plain, plain.baseline) == recipe_fingerprint(more, more.baseline)
    assert recipe_fingerprint(plain, plain.baseline) != launch["recipe_fingerprint"]


def test_load_settings_that_differ_are_named(runs, capsys, tmp_path):
    doc = yaml.safe_load(runs["plain"].read_text())
    doc["sweep"].update(duration_s=2.0, conc=[1])
    doc["workload"]["token_scale"] = 0.5
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(doc))
    code, out = _verify(capsys, changed, runs["plain-out"] / "runs" / "a-r1" / "result.json")
    assert code == 1
    assert "load flag --duration: the recipe gives '2', the run had '0.8'" in out
    assert "load flag --token-scale: the recipe gives '0.5', the run had '1'" in out
    assert "load flag --conc: the run measured 2, which the recipe's sweep does not list (1)" in out


def test_results_written_by_hand_cannot_show_their_server(runs, capsys, tmp_path):
    doc = json.loads((runs["plain-out"] / "runs" / "a-r1" / "result.json").read_text())
    del doc["launch"]
    bare = tmp_path / "result.json"
    bare.write_text(json.dumps(doc))
    code, out = _verify(capsys, runs["plain"], bare)
    assert code == 1 and "server: no launch record" in out
    assert "load flag" not in out  # the load's own command line, in the results file, still matches


def test_pareto_evidence_per_curve_and_append_only_reruns(runs, capsys):
    code, out = _verify(capsys, runs["more"], runs["more-out"], "--earlier", runs["plain-out"])
    assert code == 0
    plain_curve = recipe_fingerprint(load_recipe(str(runs["plain"])), load_recipe(str(runs["plain"])).baseline)
    assert f"append-only: yes: adds conc 4 to curve {plain_curve[:16]} (a)" in out
    assert re.search(r"curve [0-9a-f]{16} \(a\): 1 point measured \(conc 4; 1 run\), 0 invalid, 1 on the frontier "
                     r"\(conc 4\)\n  1 valid point: the review recommends 5 or more per curve\n  1 of 1 runs are no "
                     r"valid AgentX submission \(broken: .*window_duration", out)
    code, out = _verify(capsys, runs["plain"], runs["plain-out"], "--earlier", runs["plain-out"])
    assert code == 1 and "append-only: no: reruns conc 1 of curve" in out and "reruns conc 2" in out
    code, out = _verify(capsys, runs["pinned"], runs["pinned-out"], "--earlier", runs["plain-out"])
    assert code == 1 and f"append-only: no: changes the curve of variant a ({plain_curve[:16]} -> " in out


def test_a_recipe_run_writes_its_evidence(runs):
    text = (runs["plain-out"] / "report" / "evidence.txt").read_text()
    assert "2 points measured (conc 1, conc 2; 1 run), 0 invalid" in text
    evidence = json.loads((runs["plain-out"] / "report" / "evidence.json").read_text())
    assert evidence[0]["points_measured"] == 2 and evidence[0]["variants"] == ["a"]
    assert "Pareto evidence per curve" in (runs["plain-out"] / "report" / "report.html").read_text()


def test_inferencex_rows_carry_the_recipe_fingerprint_and_image(runs, capsys, tmp_path):
    result = runs["pinned-out"] / "runs" / "a-r1" / "result.json"
    fingerprint = json.loads(result.read_text())["launch"]["recipe_fingerprint"]
    code = main(["report", str(result), "--format", "agentx", "--out", str(tmp_path), "--hw", "h100",
                 "--framework", "vllm", "--precision", "fp8", "--model-prefix", "dsv4"])
    assert code == 0, capsys.readouterr().err
    rows = json.loads((tmp_path / "agentx.json").read_text())
    assert {(row["recipe_fingerprint"], row["image"]) for row in rows} == {(fingerprint, IMAGE)}



def test_our_server_run_without_the_recipes_indexer_flag_is_named(runs, capsys, tmp_path):
    """The check that failed the seed's pull request: its launch command lacked the MXFP4 indexer flag.
    A run's launch record as `recipe run` keeps it for our server, started without that flag."""
    from loadgen.recipe.provenance import launch_record, with_recipe
    from loadgen.recipe.schema import recipe_from_dict, to_yaml
    from loadgen.recipe.server import server_command

    doc = yaml.safe_load(runs["plain"].read_text())
    doc["server"] = {"kind": "ours", "flags": {"model": "v32", "tp": 8, "indexer_key_dtype": "mxfp4"}}
    with_flag = recipe_from_dict(doc)
    doc["server"]["flags"].pop("indexer_key_dtype")
    without = recipe_from_dict(doc)
    result = json.loads((runs["plain-out"] / "runs" / "a-r1" / "result.json").read_text())
    result["launch"] = with_recipe(result["launch"], launch_record(
        without, without.baseline, 1, server_command(without, without.baseline, None), "http://127.0.0.1:1"))
    path, recipe = tmp_path / "result.json", tmp_path / "recipe.yaml"
    path.write_text(json.dumps(result))
    recipe.write_text(to_yaml(with_flag))
    code, out = _verify(capsys, recipe, path)
    assert code == 1 and "server flag --indexer-key-dtype: the recipe gives 'mxfp4'; the run had none" in out
    recipe.write_text(to_yaml(without))
    code, out = _verify(capsys, recipe, path)
    assert code == 0, out


def test_the_fingerprint_is_the_curve_not_its_points_or_its_labels():
    from loadgen.recipe.schema import recipe_from_dict

    base = _recipe(Path("traces"), [1, 2])
    same = [{**base, "name": "other", "description": "x"},
            {**base, "sweep": {**base["sweep"], "conc": [8], "repeats": 3}},
            {**base, "server": {**base["server"], "startup_timeout_s": 5.0, "health_path": "/health"}},
            {**base, "compare": {"fdr": 0.01}}]
    other = [{**base, "workload": {**base["workload"], "token_scale": 0.5}},
             {**base, "sweep": {**base["sweep"], "duration_s": 9.0}},
             {**base, "server": {**base["server"], "image": "example/sse-server:2"}},
             {**base, "server": {**base["server"], "env": {"X": "1"}}}]
    recipe = recipe_from_dict(base)
    fingerprint = recipe_fingerprint(recipe, recipe.baseline)
    for doc in same + other:
        changed = recipe_from_dict(doc)
        assert (recipe_fingerprint(changed, changed.baseline) == fingerprint) == (doc in same), doc


def test_a_wrong_first_tier_of_a_repeated_flag_is_named(runs, capsys, tmp_path):
    """`--slo` is given once per recipe tier: every tier is compared, not only the last."""
    from loadgen.recipe.runner import load_command
    from loadgen.recipe.schema import recipe_from_dict

    doc = yaml.safe_load(runs["plain"].read_text())
    doc["slos"] = {"fast": "ttft<=2s", "slow": "ttft<=5s"}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(doc))
    argv = load_command(recipe_from_dict(doc), recipe_from_dict(doc).baseline, "-", Path("-"), False)
    assert argv.count("--slo") == 2
    argv[argv.index("fast=ttft<=2s")] = "fast=ttft<=3s"
    result = json.loads((runs["plain-out"] / "runs" / "a-r1" / "result.json").read_text())
    result["launch"]["load_argv"] = argv
    path = tmp_path / "result.json"
    path.write_text(json.dumps(result))
    code, out = _verify(capsys, recipe, path)
    assert code == 1
    assert ("load flag --slo: the recipe gives ('fast=ttft<=2s', 'slow=ttft<=5s'), the run had "
            "('fast=ttft<=3s', 'slow=ttft<=5s')") in out, out
