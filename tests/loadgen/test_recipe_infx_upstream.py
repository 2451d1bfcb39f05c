"""`loadgen recipe from-infx` on entries of InferenceX's own master configs (test data named with its
source): families other than dsv4 become recipes that `recipe check` accepts with the draft length
and AL InferenceX's launch scripts fix; EP, DP attention and DRAM offloading as vLLM and SGLang
flags with InferenceX's offload budget; what cannot run refused with the reason; fixed-seq-len
spaces as a trace file the replay plays."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from loadgen.cli import main
from loadgen.recipe.from_infx import read_entry, recipe_dict
from loadgen.recipe.infx_serve import FromInfxOptions, InfxConfigError

UPSTREAM = Path(__file__).with_name("data") / "infx_upstream_entries.yaml"
KIMI_HEAD = "kimik3_dspark_probabilistic_sample_method_block_rejection_sample_method"


def _recipe(key: str, **options) -> dict:
    return recipe_dict(read_entry(UPSTREAM, key), key, FromInfxOptions(**options), str(UPSTREAM))


def _made_and_checked(capsys, tmp_path: Path, key: str, *flags: str, entry: int | None = None) -> dict:
    """`recipe from-infx` to a file, then `recipe check` of that file; the recipe as written (with `entry`,
    the file of that search-space entry among the several it wrote)."""
    out = tmp_path / f"{key}.yaml"
    assert main(["recipe", "from-infx", str(UPSTREAM), key, "--out", str(out), *flags]) == 0, capsys.readouterr().err
    written = out if entry is None else out.with_name(f"{key}.{entry}.yaml")
    assert main(["recipe", "check", str(written)]) == 0, capsys.readouterr().err
    assert f"{written}: ok: 1 variant" in capsys.readouterr().out
    return yaml.safe_load(written.read_text())


def test_three_other_families_become_recipes_that_pass_check(capsys, tmp_path):
    glm = _made_and_checked(capsys, tmp_path, "glm5.2-fp8-mi325x-sglang-agentic-mtp")
    assert glm["server"]["flags"] == {
        "model": "v32", "tp": 8, "golden_al": "glm5.2", "thinking": "on",
        "speculative_config": {"method": "mtp", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic"}}
    assert glm["workload"] == {"traces": "agentic-coding", "golden_al": "glm5.2", "spec_k": 3, "thinking": "on"}
    assert "golden AL 2.99 at k=3" in glm["description"] and glm["sweep"]["conc"] == [1, 2, 3, 4, 5, 6, 8]

    minimax = _made_and_checked(capsys, tmp_path, "minimaxm3-fp8-mi325x-vllm-agentic-mtp")
    assert minimax["workload"]["spec_k"] == 3 and "golden AL 2.78 at k=3" in minimax["description"]

    qwen = _made_and_checked(capsys, tmp_path, "qwen3.5-fp8-h200-sglang-agentic-hicache-mtp", "--server", "sglang")
    assert qwen["server"] == {
        "kind": "command", "command": "python -m sglang.launch_server --model-path Qwen/Qwen3.5-397B-A17B-FP8 "
                                      "--port {port}",
        # 1,471,356 MiB x 0.8 on all 8 GPUs of an h200-dgxc node = 1,234 GB, over 8 TP ranks
        "flags": {"tp": 8, "enable_hierarchical_cache": True, "hicache_size": 154, "hicache_io_backend": "kernel",
                  "hicache_mem_layout": "page_first", "hicache_write_policy": "write_through_selective",
                  "speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
                  "speculative_num_draft_tokens": 4},
        "env": {"SGLANG_SIMULATE_ACC_LEN": "3.39", "SGLANG_SIMULATE_ACC_METHOD": "match-expected",
                "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token"},
        "gpus": 8, "image": "lmsysorg/sglang:nightly-dev-cu13-20260815-a5ba081f"}

    kimi = _made_and_checked(capsys, tmp_path, "kimik3-fp4-mi355x-vllm-agentic-mtp", entry=0)  # no flags either
    assert kimi["server"]["flags"]["speculative_config"]["method"] == "dspark"
    assert kimi["workload"] == {"traces": "agentic-coding", "golden_al": "kimik3", "spec_k": 2, "thinking": "on"}
    assert "golden AL 2.51 at k=2" in kimi["description"]


def test_an_entry_with_several_search_spaces_gives_one_recipe_each_and_names_those_it_skips(capsys, tmp_path):
    out = tmp_path / "kimi.yaml"
    assert main(["recipe", "from-infx", str(UPSTREAM), "kimik3-fp4-mi355x-vllm-agentic-mtp", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"wrote {tmp_path / 'kimi.0.yaml'}" in captured.out and not out.exists()
    assert "skipped search-space entry 1:" in captured.err and "kv-offloading dram" in captured.err
    assert not (tmp_path / "kimi.1.yaml").exists()
    assert main(["recipe", "from-infx", str(UPSTREAM), "qwen3.5-fp8-b200-sglang",
                 "--out", str(tmp_path / "q.yaml")]) == 0
    assert sorted(p.name for p in tmp_path.glob("q.*.yaml")) == ["q.0.yaml", "q.1.yaml"]
    capsys.readouterr()  # printed instead: one YAML document per recipe
    assert main(["recipe", "from-infx", str(UPSTREAM), "dsv4-fp4-b300-vllm-agentic-mtp", "--spec-k", "3",
                 "--server", "vllm"]) == 0
    printed = capsys.readouterr().out
    documents = list(yaml.safe_load_all(printed))
    assert len(documents) == 3 and all(d["schema"] == "agentload.recipe/1" for d in documents)
    assert printed.startswith("# generated by") and printed.count("\n---\n") == 2


def test_vllm_gets_the_draft_head_of_infx_scripts_at_the_golden_al():
    minimax = _recipe("minimaxm3-fp8-mi325x-vllm-agentic-mtp", server="vllm")
    assert minimax["server"]["flags"] == {
        "tensor_parallel_size": 8,
        "speculative_config": {"method": "eagle3", "model": "Inferact/MiniMax-M3-EAGLE3-GQA",
                               "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
                               "synthetic_acceptance_length": 2.78}}
    assert minimax["server"]["command"] == "vllm serve MiniMaxAI/MiniMax-M3-MXFP8 --port {port}"
    kimi = _recipe("kimik3-fp4-mi355x-vllm-agentic-mtp", entry=0, server="vllm", spec_k=6)
    assert kimi["server"]["flags"]["speculative_config"] == {
        "method": "dspark", "model": "Inferact/Kimi-K3-DSpark", "num_speculative_tokens": 6,
        "rejection_sample_method": "synthetic", "synthetic_acceptance_length": 3.75}


def test_dep_and_dram_offload_map_to_vllm_flags_with_infx_budget():
    tp = _recipe("dsv4-fp4-b300-vllm-agentic-mtp", entry=1, server="vllm")["server"]
    # min(2,964,436 MiB, the 2,861,022 MiB cap) x 0.95 x 4 of 8 GPUs = 1,424 GB, over the 4 GPUs
    assert tp["flags"]["kv_transfer_config"] == {
        "kv_connector": "SimpleCPUOffloadConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 356_000_000_000, "lazy_offload": True}}
    assert tp["flags"]["tensor_parallel_size"] == 4 and tp["gpus"] == 4
    dep = _recipe("dsv4-fp4-b300-vllm-agentic-mtp", entry=2, server="vllm", offload_gb=100)
    flags = dep["server"]["flags"]
    assert (flags["tensor_parallel_size"], flags["data_parallel_size"], flags["enable_expert_parallel"]) == (1, 4, True)
    assert flags["kv_transfer_config"]["kv_connector_extra_config"] == {"cpu_bytes_to_use": 25_000_000_000,
                                                                        "lazy_offload": False}
    assert flags["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 3,
                                           "rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.49}
    assert dep["variants"] == [{"name": "tp4-ep4-dpattn"}] and dep["sweep"]["conc"] == [48, 64]
    sglang = _recipe("dsv4-fp4-b300-vllm-agentic-mtp", entry=0, server="sglang")["server"]
    assert sglang["flags"]["tp"] == 8 and sglang["env"]["SGLANG_SIMULATE_ACC_LEN"] == "2.49"


def test_sglang_dp_attention_and_expert_parallel():
    entry = read_entry(UPSTREAM, "dsv4-fp4-b300-vllm-agentic-mtp")
    entry["scenarios"]["agentic-coding"][0]["search-space"][2]["kv-offloading"] = "none"
    flags = recipe_dict(entry, "dep", FromInfxOptions(entry=2, server="sglang"))["server"]["flags"]
    assert {key: flags[key] for key in ("tp", "dp", "enable_dp_attention", "ep_size")} == \
        {"tp": 4, "dp": 4, "enable_dp_attention": True, "ep_size": 4}


@pytest.mark.parametrize(("key", "options", "message"), [
    ("kimik3-fp4-b300-vllm-agentic-dspark", {"server": "vllm"},
     r"--spec-k: InferenceX's kimik3_fp4_b300_vllm_mtp.sh picks the draft length by concurrency \(conc <= 8: k=7 "
     r"\(AL 3.84\); conc <= 16: k=3 \(AL 3\); higher: no drafts\), and this search space's concurrencies .* span more"),
    ("kimik3-fp4-b300-vllm-agentic-dspark", {"server": "vllm", "spec_k": 3},
     r"only tp, ep and DP attention map to vllm flags here, not dcp 8"),
    ("kimik3-fp4-mi355x-atom-agentic-mtp", {"entry": 0}, r"picks the draft length by concurrency \(conc <= 1: k=6"),
    ("kimik3-fp4-mi355x-atom-agentic-mtp", {"entry": 1, "server": "vllm"},
     r"KV offloading through lmcache needs a service beside the server that a recipe does not start"),
    ("kimik3-fp4-mi355x-vllm-agentic-mtp", {"entry": 0, "server": "sglang"}, r"SGLang has no DSpark drafts"),
    ("kimik3-fp4-mi355x-vllm-agentic-mtp", {"entry": 1}, r"our server runs tensor parallelism only, not "
                                                          r"kv-offloading dram"),
    ("dsv4-fp4-b300-vllm-agentic-mtp", {"entry": 2, "server": "sglang"},
     r"SGLang offloads to DRAM through hicache here, not vllm-simple"),
    ("qwen3.5-fp8-b200-sglang", {"entry": 0, "scenario": "agentic-coding"}, r"no agentic-coding scenario"),
])
def test_what_cannot_run_is_refused_with_the_reason(key, options, message):
    with pytest.raises(InfxConfigError, match=message):
        _recipe(key, **options)


def test_a_banded_script_gives_k_when_the_space_stays_in_one_band():
    recipe = _recipe("kimik3-fp4-mi355x-atom-agentic-mtp", entry=1, server="url", url="http://h:1")
    assert recipe["workload"]["spec_k"] == 2 and "golden AL 2.51 at k=2" in recipe["description"]
    chosen = _recipe("kimik3-fp4-mi355x-atom-agentic-mtp", entry=0, server="url", url="http://h:1", spec_k=7)
    assert chosen["workload"]["spec_k"] == 7 and "golden AL 3.84 at k=7" in chosen["description"]


@pytest.mark.parametrize("server", ["ours", "vllm", "sglang"])
def test_a_draft_head_no_script_names_runs_only_at_a_url(server):
    """kimik2.5's curve is EAGLE3, and no launch script known here names its head: a recipe cannot
    start a server for it, and one at --url serves it with its own."""
    entry = {**read_entry(UPSTREAM, "minimaxm3-fp8-mi325x-vllm-agentic-mtp"), "model-prefix": "kimik2.5"}
    with pytest.raises(InfxConfigError, match=r"the EAGLE3 draft head of kimik2\.5 is named in no InferenceX launch "
                                              r"script known here .*; start the server yourself and use --server url"):
        recipe_dict(entry, "k", FromInfxOptions(server=server, spec_k=3))
    recipe = recipe_dict(entry, "k", FromInfxOptions(server="url", url="http://h:1", spec_k=3))
    assert recipe["server"] == {"kind": "url", "url": "http://h:1", "gpus": 8}
    assert recipe["workload"] == {"traces": "agentic-coding", "golden_al": "kimik2.5", "spec_k": 3, "thinking": "on"}
    assert "golden AL 2.88 at k=3 thinking on" in recipe["description"]


def test_a_multinode_entry_runs_only_at_a_url():
    entry = {**read_entry(UPSTREAM, "glm5.2-fp8-mi325x-sglang-agentic-mtp"), "multinode": True}
    with pytest.raises(InfxConfigError, match="a multi-node entry needs its own launcher"):
        recipe_dict(entry, "m", FromInfxOptions(server="sglang"))
    assert recipe_dict(entry, "m", FromInfxOptions(server="url", url="http://h:1"))["server"]["gpus"] == 8


def test_fixed_seq_len_space_replays_infx_random_lengths(capsys, tmp_path, start_server, replay):
    from traces.readers import load_traces

    recipe = _made_and_checked(capsys, tmp_path, "qwen3.5-fp8-b200-sglang", "--entry", "1", "--duration", "2")
    trace = Path(recipe["workload"]["traces"])
    assert trace == (tmp_path / "qwen3.5-fp8-b200-sglang-isl8192-osl1024.jsonl").resolve()
    assert recipe["sweep"] == {"conc": [4, 8, 16, 32, 64, 128, 256], "duration_s": 2.0}
    assert "`loadgen report --format infx --isl 8192 --osl 1024`" in recipe["description"]
    sessions = load_traces(trace).sessions
    assert len(sessions) == 256 * 10  # InferenceX's conc x 10 prompts at the highest level
    lengths = [(s.requests[0].input_tokens, s.requests[0].output_tokens) for s in sessions]
    assert all(6553 <= n_in <= 8192 and 819 <= n_out <= 1024 and not s.requests[0].hash_ids
               for (n_in, n_out), s in zip(lengths, sessions))
    assert len(set(lengths)) > 2000  # drawn, not one length
    server = start_server(first_ms=2, itl_ms=1)
    code, doc, _ = replay(server.url, "--traces", str(trace), "--token-scale", "0.01", "--conc", "2",
                          "--duration", "1", "--gpu-telemetry", "off")
    assert code == 0 and doc["levels"][0]["counts"]["requests_ok"] > 0
