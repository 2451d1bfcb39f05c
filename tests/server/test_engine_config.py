"""Engine configuration: presets, flag parsing, and validation errors that name the flag."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from server.args import add_engine_args, engine_config_from_args
from server.config import CacheConfig, EngineConfig, SchedulerConfig, SpeculativeConfig, model_preset


def parse(*argv: str) -> EngineConfig:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return engine_config_from_args(parser.parse_args(list(argv)))


def test_presets_match_sparse_mla_table():
    tiny, small, v32 = model_preset("tiny"), model_preset("small"), model_preset("v32")
    tiny_shape = (tiny.hidden_size, tiny.num_layers, tiny.num_heads, tiny.kv_lora_rank, tiny.index_topk)
    assert tiny_shape == (256, 2, 16, 128, 32)
    assert (small.hidden_size, small.q_lora_rank, small.index_num_heads, small.index_head_dim) == (2048, 512, 16, 128)
    assert (v32.num_heads, v32.q_lora_rank, v32.kv_row_dim, v32.index_topk) == (128, 1536, 576, 2048)
    assert v32.softmax_scale == pytest.approx(192 ** -0.5)
    assert (tiny.vocab_size, small.vocab_size, v32.vocab_size) == (1024, 32768, 129280)
    assert tiny.bos_token_id == 256 and tiny.eos_token_id == 257


def test_flags_build_config():
    c = parse("--model", "tiny", "--num-layers", "3", "--top-k", "16", "--block-size", "32",
              "--kv-cache-dtype", "fp8", "--indexer-key-dtype", "mxfp4", "--no-prefix-caching",
              "--max-num-seqs", "8", "--max-num-batched-tokens", "64", "--max-model-len", "512",
              "--device", "cpu", "--seed", "7")
    assert c.model.num_layers == 3 and c.model.index_topk == 16
    assert c.cache == CacheConfig(block_size=32, kv_cache_dtype="fp8", indexer_key_dtype="mxfp4",
                                  enable_prefix_caching=False)
    assert c.scheduler == SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=512)
    assert c.seed == 7 and c.device == "cpu"


def test_cuda_graph_flags():
    assert parse("--device", "cpu").enforce_eager is False
    c = parse("--device", "cpu", "--enforce-eager", "--cuda-graph-sizes", "1,2,8")
    assert c.enforce_eager and c.cuda_graph_sizes == (1, 2, 8)


def test_overlap_schedule_flag():
    assert parse("--device", "cpu").overlap_schedule == "auto"
    assert parse("--device", "cpu", "--overlap-schedule", "off").overlap_schedule == "off"
    with pytest.raises(SystemExit):
        parse("--overlap-schedule", "yes")


def test_overlap_is_auto_off_on_cpu_and_can_be_forced_on():
    """On CPU a step runs as it is launched: auto leaves tokens to be emitted the step they are made."""
    from server.engine.core import Engine
    from tests.server.engine_fixtures import tiny_config

    assert not Engine(tiny_config()).overlap
    assert Engine(dataclasses.replace(tiny_config(), overlap_schedule="on")).overlap
    with pytest.raises(ValueError, match="--overlap-schedule"):
        Engine(dataclasses.replace(tiny_config(), overlap_schedule="yes"))


def test_overlap_on_is_refused_where_it_is_not_built():
    spec = '{"method": "mtp", "num_speculative_tokens": 3}'
    assert parse("--device", "cpu", "--speculative-config", spec).overlap_schedule == "auto"
    with pytest.raises(ValueError, match="--overlap-schedule on: not available with standard speculative"):
        parse("--device", "cpu", "--speculative-config", spec, "--overlap-schedule", "on")
    synthetic = ('{"method": "mtp", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic", '
                 '"synthetic_acceptance_length": 2.5}')
    overlapped = parse("--device", "cpu", "--speculative-config", synthetic, "--overlap-schedule", "on")
    assert overlapped.overlap_schedule == "on"
    with pytest.raises(ValueError, match="--overlap-schedule on: not available with --tp 2"):
        parse("--device", "cpu", "--tp", "2", "--overlap-schedule", "on")


def test_defaults_follow_preset():
    c = parse("--model", "small", "--device", "cpu")
    assert c.cache.block_size == 64 and c.scheduler.max_model_len == 32768


@pytest.mark.parametrize("argv, flag", [
    (("--model", "small", "--block-size", "32"), "--block-size"),
    (("--model", "tiny", "--block-size", "24"), "--block-size"),
    (("--num-layers", "0"), "--num-layers"),
    (("--top-k", "-1"), "--top-k"),
    (("--max-model-len", "100000"), "--max-model-len"),
    (("--max-num-seqs", "64", "--max-num-batched-tokens", "8"), "--max-num-batched-tokens"),
    (("--long-prefill-tokens", "-1"), "--long-prefill-tokens"),
    (("--kv-cache-gb", "0"), "--kv-cache-gb"),
    (("--gpu-memory-utilization", "1.5"), "--gpu-memory-utilization"),
    (("--weights", "/nonexistent/w.safetensors"), "--weights"),
    (("--cuda-graph-sizes", "1,x"), "--cuda-graph-sizes"),
    (("--cuda-graph-sizes", "4,0"), "--cuda-graph-sizes"),
])
def test_invalid_flags_name_the_flag(argv, flag):
    with pytest.raises(ValueError, match=flag):
        parse("--device", "cpu", *argv)


def test_cuda_without_gpu_names_device_flag():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match="--device cuda"):
        parse("--device", "cuda")


def test_fp8_kv_needs_latent_dim_multiple_of_128():
    import dataclasses

    model = dataclasses.replace(model_preset("tiny"), kv_lora_rank=64)
    with pytest.raises(ValueError, match="--kv-cache-dtype fp8"):
        EngineConfig(model=model, cache=CacheConfig(kv_cache_dtype="fp8"), device="cpu")


def test_unknown_preset():
    with pytest.raises(ValueError, match="--model"):
        model_preset("huge")


def test_a_step_hands_on_a_token_per_request_and_its_drafts():
    from tests.server.engine_fixtures import tiny_config

    plain = tiny_config(max_num_seqs=4)
    speculative = dataclasses.replace(plain, speculative=SpeculativeConfig("mtp", 3, "standard"))
    assert (plain.num_speculative_tokens, plain.max_step_outputs) == (0, 4)
    assert (speculative.num_speculative_tokens, speculative.max_step_outputs) == (3, 16)
