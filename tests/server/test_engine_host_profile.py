"""The engine's decode step keeps its host work per layer bounded: no host sync, ten Triton
launches, a bounded number of torch ops (counted by benchmarks/engine_host_profile.py on the CUDA
code path; counts, not timings)."""

from __future__ import annotations

import argparse

from benchmarks.engine_host_profile import LaunchCounter, gpu_code_path, profile


def per_step(num_layers: int, launches: LaunchCounter) -> dict:
    args = argparse.Namespace(model="tiny", num_layers=num_layers, batch=2, context=40, kv="bf16",
                              steps=1, warmup=1, top=0)  # context above tiny's top-k: a real selection
    return profile(args, "triton", launches)


def test_decode_step_host_work_per_layer():
    with LaunchCounter() as launches, gpu_code_path():
        one, two = per_step(1, launches), per_step(2, launches)
    assert two["syncs"] == one["syncs"], f"host syncs per layer: {two['sync_detail']} vs {one['sync_detail']}"
    # the only per-step reads: min and max of the step's slots, a host tensor, in the runner
    assert one["sync_detail"] == {"item": 2.0}
    # the two preparation kernels (MLA's and the indexer's norms, rotations and cache writes),
    # indexer, top-k writing slots (one launch: rows this short take the single-pass kernel, which
    # maps positions to slots itself), sparse MLA, 2 residual add + norm, q_norm (the same norm
    # kernel), silu * up
    assert two["launches"] - one["launches"] == 9, (one, two)
    assert two["ops"] - one["ops"] <= 60
