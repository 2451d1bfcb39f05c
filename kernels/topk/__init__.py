"""Exact per-row top-k column indices with per-row lengths, and their mapping to cache slots.

`topk_indices` returns the columns, `topk_slots` their cache slots (what sparse attention reads);
each runs the torch reference (`reference.py`) or the Triton path that `topk_triton` picks
(`dispatch.py`). Every Triton path selects on order-preserving 32-bit keys and writes every column
above the k-th largest key plus just enough columns equal to it, ties by lowest column; rows no
longer than k emit 0..len-1 then -1.

The path follows from the row and column counts and the config alone (`config.py`), so a CUDA
graph keeps a fixed choice; a row's length and values only steer branches on the device:
- rows up to `TopkConfig.single_pass_max_cols` columns (`in_registers.py`): one launch, one program
  per row holding the row in registers; no scratch table, atomics or further launches, because at
  decode shapes a launch costs more than the work;
- longer rows, spread over (rows x programs, each looping over chunks of columns up to the row's
  length) so that a few long rows still fill the GPU, either
  - batches of many columns (`sampled.py`): a threshold from each row's sample, one full-row pass
    marking the columns that reach it, a finish over the marked columns in registers; or
  - smaller batches (`compacting.py`): two full-row histogram levels (`radix.py`) fix the top 16
    bits of the k-th largest key, a split lists the columns of that bin, and one program per row
    finishes on its list.
Both multi-launch paths write each row in ascending column order, so the output does not depend on
the order in which programs ran (the sparse attention sums its rows in the order given).
`slots.py` holds the block-table lookup, in a kernel's own write or as a launch of its own.
"""

from __future__ import annotations

from kernels.topk.config import FINE_CHUNK_MAX_COLS, SINGLE_PASS_MAX_COLS, TopkConfig, default_config
from kernels.topk.dispatch import topk_indices, topk_slots, topk_triton
from kernels.topk.reference import topk_indices_torch
from kernels.topk.slots import SlotMap, positions_to_slots, positions_to_slots_reference

__all__ = [
    "FINE_CHUNK_MAX_COLS",
    "SINGLE_PASS_MAX_COLS",
    "SlotMap",
    "TopkConfig",
    "default_config",
    "positions_to_slots",
    "positions_to_slots_reference",
    "topk_indices",
    "topk_indices_torch",
    "topk_slots",
    "topk_triton",
]
