"""Top-k positions mapped to global cache slots through a block table: the lookup as a device
helper, which the one-launch and sampled kernels run as they write, and as a launch of its own
(`positions_to_slots`) after the compacting path and on the torch backend."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.backend import resolve_backend, values_checkable
from kernels.triton_utils import new_output


@dataclass(frozen=True)
class SlotMap:
    """What maps a row's positions to global cache slots: the block table (int32 [requests,
    blocks]), the request of each row (seq_ids, int32 [T]) and the block size."""

    block_table: torch.Tensor
    seq_ids: torch.Tensor
    block_size: int


@triton.jit
def slots_of(pos, mask, table_row, BLOCK_SIZE: tl.constexpr, TO_SLOTS: tl.constexpr):
    """With TO_SLOTS, the cache slots of positions of one request (table_row: its block table row)
    where mask holds; else the positions themselves."""
    if TO_SLOTS:
        block = tl.load(table_row + pos // BLOCK_SIZE, mask=mask, other=0)
        return block * BLOCK_SIZE + pos % BLOCK_SIZE
    else:
        return pos


@triton.jit
def request_table_row(table_ptr, seq_ids_ptr, table_stride, TO_SLOTS: tl.constexpr):
    """The block table row of the request of program_id(0)'s row (unread without TO_SLOTS)."""
    if TO_SLOTS:
        return table_ptr + tl.load(seq_ids_ptr + tl.program_id(0)).to(tl.int64) * table_stride
    else:
        return table_ptr


@triton.jit
def _positions_to_slots_kernel(idx_ptr, block_table_ptr, seq_ids_ptr, out_ptr, k, table_stride, block_size,
                               BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = j < k
    pos = tl.load(idx_ptr + t * k + j, mask=ok, other=-1)
    valid = pos >= 0
    pos = tl.where(valid, pos, 0)
    table_row = block_table_ptr + tl.load(seq_ids_ptr + t).to(tl.int64) * table_stride
    block = tl.load(table_row + pos // block_size, mask=ok & valid, other=0)
    tl.store(out_ptr + t * k + j, tl.where(valid, block * block_size + pos % block_size, -1), mask=ok)


def slot_args(slots: SlotMap | None, out: torch.Tensor,
              lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A slot-writing kernel's (block table, seq ids, block size); without slots the output and the
    lengths stand in for the tables, which the kernel then never reads."""
    if slots is None:
        return out, lengths, 1
    return slots.block_table.int(), slots.seq_ids.int().contiguous(), slots.block_size


def positions_to_slots_reference(idx: torch.Tensor, block_table: torch.Tensor, seq_ids: torch.Tensor,
                                 block_size: int) -> torch.Tensor:
    valid = idx >= 0
    pos = torch.where(valid, idx, 0)
    blocks = block_table[seq_ids[:, None], pos // block_size]
    return torch.where(valid, blocks * block_size + pos % block_size, -1).int()


def positions_to_slots(idx: torch.Tensor, block_table: torch.Tensor, seq_ids: torch.Tensor,
                       block_size: int, backend: str | None = None) -> torch.Tensor:
    """int32[T, k]: positions idx[T, k] of request seq_ids[t] mapped to global slots through the
    block table; -1 stays -1. One kernel on the Triton backend (the torch code is a dozen)."""
    if idx.dim() != 2 or seq_ids.shape != (idx.shape[0],):
        raise ValueError(f"positions_to_slots: idx [T, k] and seq_ids [T] expected, "
                         f"got {list(idx.shape)}, {list(seq_ids.shape)}")
    # a host sync on a GPU (values_checkable): there top-k positions come from context lengths
    # that the block table already covers
    if idx.numel() and values_checkable(idx) and int(idx.max()) >= block_table.shape[1] * block_size:
        raise ValueError("positions_to_slots: a position lies beyond the block table")
    if resolve_backend(backend, idx.device) == "torch":
        return positions_to_slots_reference(idx, block_table, seq_ids, block_size)
    t, k = idx.shape
    out = new_output((t, k), torch.int32, idx.device)
    if t and k:
        table = block_table.int()
        block = min(1024, triton.next_power_of_2(k))
        _positions_to_slots_kernel[(t, triton.cdiv(k, block))](
            idx.int().contiguous(), table, seq_ids.int().contiguous(), out, k, table.stride(0), block_size,
            BLOCK=block, num_warps=4)
    return out
