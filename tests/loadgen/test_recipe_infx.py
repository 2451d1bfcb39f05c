"""`loadgen recipe from-infx CONFIG KEY`: InferenceX master-config entries (a fixture in their shape)
become recipes for our server, a vLLM command or a URL; golden AL by model prefix and k; errors
name the key; the YAML passes the recipe schema's own validator when that module is present."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from loadgen.recipe.from_infx import (
    FromInfxOptions,
    InfxConfigError,
    concurrencies,
    read_entry,
    recipe_dict,
    register_from_infx,
)

CONFIG = Path(__file__).with_name("data") / "infx_master_config.yaml"
DSV4 = "dsv4-fp4-h200-vllm-agentic-mtp"


def _recipe(key: str = DSV4, **options) -> dict:
    return recipe_dict(read_entry(CONFIG, key), key, FromInfxOptions(**options), str(CONFIG))


def _validate_with_recipe_schema(recipe: dict) -> None:
    """The recipe schema's own validator and `loadgen recipe check`'s flag check against the engine."""
    from loadgen.recipe.check import check_recipe
    from loadgen.recipe.schema import recipe_from_dict, to_dict

    built = recipe_from_dict(yaml.safe_load(yaml.safe_dump(recipe)), "from-infx")
    check_recipe(built, "from-infx")
    assert to_dict(built)["sweep"]["conc"] == recipe["sweep"]["conc"]


def test_our_server_recipe_with_golden_al_selected_by_model_prefix():
    recipe = _recipe(entry=0, spec_k=3)
    assert recipe["schema"] == "agentload.recipe/1" and recipe["name"] == DSV4
    assert recipe["server"] == {"kind": "ours", "flags": {
        "model": "v32", "tp": 8,
        "speculative_config": {"method": "mtp", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic"},
        "golden_al": "dsv4", "thinking": "on"}}
    assert recipe["workload"] == {"traces": "agentic-coding", "golden_al": "dsv4", "spec_k": 3, "thinking": "on"}
    assert recipe["sweep"] == {"conc": [1, 4, 8, 16], "duration_s": 3600.0}
    assert recipe["variants"] == [{"name": "tp8"}]
    assert "golden AL 2.49 at k=3 thinking on" in recipe["description"]  # dsv4_mtp, thinking_on, k=3
    _validate_with_recipe_schema(recipe)


def test_vllm_and_url_servers_carry_topology_and_synthetic_acceptance():
    vllm = _recipe(entry=2, spec_k=3, server="vllm", thinking="off")
    assert vllm["server"]["command"] == "vllm serve deepseek-ai/DeepSeek-V4-Pro --port {port}"
    assert vllm["server"]["flags"] == {
        "tensor_parallel_size": 4, "enable_expert_parallel": True,
        "speculative_config": {"method": "mtp", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
                               "synthetic_acceptance_length": 2.97}}  # dsv4_mtp thinking_off k=3
    assert vllm["server"]["gpus"] == 4 and vllm["sweep"]["conc"] == [4, 8, 16, 32, 48]
    assert vllm["variants"] == [{"name": "tp4-ep4"}]
    url = _recipe(entry=1, spec_k=2, server="url", url="http://127.0.0.1:8000")
    assert url["server"] == {"kind": "url", "url": "http://127.0.0.1:8000", "gpus": 8}
    assert url["variants"] == [{"name": "tp8-ep8-dpattn"}]
    for recipe in (vllm, url):
        _validate_with_recipe_schema(recipe)


def test_conc_start_end_doubles_and_keeps_the_end():
    assert concurrencies({"conc-start": 4, "conc-end": 48}, "x") == [4, 8, 16, 32, 48]
    assert concurrencies({"conc-start": 1, "conc-end": 8}, "x") == [1, 2, 4, 8]
    assert concurrencies({"conc-start": 5, "conc-end": 5}, "x") == [5]
    with pytest.raises(InfxConfigError, match="needs conc-list or conc-start <= conc-end"):
        concurrencies({"conc-start": 8, "conc-end": 4}, "x")


@pytest.mark.parametrize(("key", "options", "message"), [
    (DSV4, {"spec_k": 3}, r"--entry: .* has 3 search-space entries, choose one: 0: tp 8, ep 1, .*conc \[1, 4, 8, 16\]"),
    (DSV4, {"entry": 0}, r"--spec-k: .* speculates; InferenceX keeps the draft length in its launch scripts, and "
     r"none known here \(golden_al/infx_pins.yaml\) runs dsv4 fp4 h200 vllm: give it"),
    (DSV4, {"entry": 0, "spec_k": 9}, r"--golden-al: curve 'dsv4_mtp' .* no thinking_on AL at k=9"),
    (DSV4, {"entry": 1, "spec_k": 3}, r"our server runs tensor parallelism only, not ep 8, dp-attn"),
    (DSV4, {"entry": 3, "spec_k": 3}, r"--entry: .* entries 0\.\.2, got 3"),
    (DSV4, {"entry": 0, "spec_k": 3, "server": "url"}, r"--url: required"),
    ("qwen3.5-fp8-h200-sglang-agentic", {}, r"tensor parallelism only, not kv-offloading dram"),
    ("qwen3.5-fp8-h200-sglang-agentic", {"spec_k": 2, "server": "url", "url": "http://h:1"},
     r"--spec-k: .* no speculative"),
    ("glm5.2-fp8-h200-sglang-agentic-mtp", {"spec_k": 9}, r"--golden-al: curve 'glm5\.2_mtp' .* no thinking_on AL "
     r"at k=9"),
    ("dsr1-fp8-h200-sglang", {"scenario": "agentic-coding"}, r"no agentic-coding scenario \(it has: fixed-seq-len\)"),
    ("dsr1-fp8-h200-sglang", {}, r"--out: .* is a fixed-seq-len scenario; its requests are written as a trace file"),
])
def test_bad_entries_and_options_name_the_key(key, options, message):
    with pytest.raises(InfxConfigError, match=message):
        _recipe(key, **options)


def test_the_prefix_selects_the_curve_its_scripts_cite_and_another_can_be_named():
    recipe = _recipe("glm5.2-fp8-h200-sglang-agentic-mtp", spec_k=3)
    assert recipe["workload"]["golden_al"] == "glm5.2" and "golden AL 2.99" in recipe["description"]
    named = _recipe("glm5.2-fp8-h200-sglang-agentic-mtp", spec_k=3, golden_al="glm5.2_mtp")
    assert named["workload"]["golden_al"] == "glm5.2_mtp" and "golden AL 2.99" in named["description"]


def test_unknown_key_and_unreadable_config(tmp_path):
    with pytest.raises(InfxConfigError, match=r"no entry 'dsv4-fp8-b200-vllm'; entries of that model: dsv4-fp4-h200"):
        read_entry(CONFIG, "dsv4-fp8-b200-vllm")
    with pytest.raises(InfxConfigError, match="cannot read"):
        read_entry(tmp_path / "missing.yaml", "x")
    bad = tmp_path / "bad.yaml"
    bad.write_text("x:\n  model: m\n")
    with pytest.raises(InfxConfigError, match=r"x\.model-prefix: missing"):
        read_entry(bad, "x")


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="loadgen recipe")
    register_from_infx(parser.add_subparsers(dest="action", required=True))
    args = parser.parse_args(["from-infx", *argv])
    return args.func(args)


def test_command_prints_or_writes_the_yaml(capsys, tmp_path):
    assert _cli(str(CONFIG), DSV4, "--entry", "0", "--spec-k", "3", "--duration", "120") == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# generated by `loadgen recipe from-infx infx_master_config.yaml ")
    recipe = yaml.safe_load(printed)
    assert recipe["sweep"] == {"conc": [1, 4, 8, 16], "duration_s": 120.0}
    out = tmp_path / "r.yaml"
    assert _cli(str(CONFIG), DSV4, "--entry", "0", "--spec-k", "3", "--out", str(out)) == 0
    assert yaml.safe_load(out.read_text())["server"]["flags"]["golden_al"] == "dsv4"
    from loadgen.cli import UsageError

    with pytest.raises(UsageError, match="--spec-k"):
        _cli(str(CONFIG), DSV4, "--entry", "0")


def test_through_loadgen_recipe_and_recipe_check(capsys, tmp_path):
    from loadgen.cli import main

    out = tmp_path / "dsv4.yaml"
    assert main(["recipe", "from-infx", str(CONFIG), DSV4, "--entry", "0", "--spec-k", "3", "--out", str(out)]) == 0
    assert main(["recipe", "check", str(out)]) == 0
    assert f"{out}: ok" in capsys.readouterr().out
    assert main(["recipe", "from-infx", str(CONFIG), "no-such-entry"]) == 2
    assert "no entry 'no-such-entry'" in capsys.readouterr().err


def test_from_infx_errors_name_the_command(capsys, tmp_path):
    """Its --command flag once took the top-level command's place: errors read `loadgen None: error`."""
    from loadgen.cli import main

    assert main(["recipe", "from-infx", str(tmp_path / "missing.yaml"), "key"]) == 2
    assert capsys.readouterr().err.startswith("loadgen recipe: error: ")
