"""The top-k entry points: input checks, then the torch reference or the Triton path that the config
picks for the rows' width (one launch in registers, sampled, or compacting)."""

from __future__ import annotations

import torch

from kernels.backend import resolve_backend, values_checkable
from kernels.topk.compacting import topk_compacting
from kernels.topk.config import TopkConfig, default_config, takes_register_launch
from kernels.topk.in_registers import topk_in_registers
from kernels.topk.reference import topk_indices_torch
from kernels.topk.sampled import topk_sampled
from kernels.topk.slots import SlotMap, positions_to_slots
from kernels.triton_utils import new_output


def topk_triton(logits: torch.Tensor, lengths: torch.Tensor, k: int, config: TopkConfig | None = None,
                slots: SlotMap | None = None) -> torch.Tensor:
    """One launch over rows up to config.single_pass_max_cols columns (the row in registers);
    beyond, over (rows x programs per row), the sampled path or the compacting path (SPLIT_LEVEL
    histogram levels, the split, then one program per row finishing on its candidates). With
    `slots` the outputs are cache slots: the in-register kernel and the sampled path look them
    up as they write (no second launch); the compacting path maps its positions afterwards."""
    t, n = logits.shape
    out = new_output((t, k), torch.int32, logits.device)
    if t == 0:
        return out
    cfg = config or default_config(logits.device, n, t)
    if takes_register_launch(cfg, n):
        return topk_in_registers(logits, lengths, out, k, cfg.num_warps, slots)
    if cfg.sample and 2 * k <= cfg.candidates:
        return topk_sampled(logits, lengths, out, k, cfg, slots)
    positions = topk_compacting(logits, lengths, out, k, cfg)
    if slots is None:
        return positions
    return positions_to_slots(positions, slots.block_table, slots.seq_ids, slots.block_size, backend="triton")


def topk_indices(logits: torch.Tensor, lengths: torch.Tensor, k: int, backend: str | None = None) -> torch.Tensor:
    """int32[T, k]: exact top-k column indices among each row's first lengths[t] columns, in an
    order that depends on the row's values alone (ascending on the multi-launch paths).

    Rows with lengths[t] <= k emit 0..len-1 then -1.
    """
    _check_topk_inputs("topk_indices", logits, lengths, k)
    if _takes_torch(logits, backend):
        return topk_indices_torch(logits, lengths, k)
    return topk_triton(logits.contiguous(), lengths.int().contiguous(), k)


def topk_slots(logits: torch.Tensor, lengths: torch.Tensor, k: int, block_table: torch.Tensor,
               seq_ids: torch.Tensor, block_size: int, backend: str | None = None) -> torch.Tensor:
    """int32[T, k]: the cache slots of topk_indices' columns, row t's positions read through
    block_table[seq_ids[t]] in blocks of block_size; -1 stays -1. The same as positions_to_slots
    over topk_indices, in one launch where the top-k takes the in-register kernel (the decode
    step's rows)."""
    _check_topk_inputs("topk_slots", logits, lengths, k)
    if seq_ids.shape != (logits.shape[0],):
        raise ValueError(f"topk_slots: seq_ids must be [T={logits.shape[0]}], got {list(seq_ids.shape)}")
    # a host sync on a GPU (values_checkable): there the context lengths come from a block table
    # that covers them
    if logits.numel() and values_checkable(lengths) and (
            int(lengths.clamp(max=logits.shape[1]).max()) > block_table.shape[1] * block_size):
        raise ValueError("topk_slots: a row's length reaches beyond the block table")
    if _takes_torch(logits, backend):
        top = topk_indices_torch(logits, lengths, k)
        return positions_to_slots(top, block_table, seq_ids, block_size, backend=backend)
    return topk_triton(logits.contiguous(), lengths.int().contiguous(), k,
                       slots=SlotMap(block_table, seq_ids, block_size))


def _check_topk_inputs(op: str, logits: torch.Tensor, lengths: torch.Tensor, k: int) -> None:
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"{op}: logits must be fp32[T, N], got {logits.dtype}{list(logits.shape)}")
    if lengths.shape != (logits.shape[0],):
        raise ValueError(f"{op}: lengths must be [T={logits.shape[0]}], got {list(lengths.shape)}")
    if k <= 0:
        raise ValueError(f"{op}: k={k} must be positive")


def _takes_torch(logits: torch.Tensor, backend: str | None) -> bool:
    """Whether the top-k of these rows runs the torch path: the backend alone. Prefill chunks take
    the Triton paths too (the sampled path past SINGLE_PASS_MAX_COLS): torch.topk behind a length
    mask reads every row to the chunk's full width and takes several times as long over a
    prefill chunk's ragged rows (`benchmarks/kernels.py --only prefill` times both)."""
    return resolve_backend(backend, logits.device) == "torch"
