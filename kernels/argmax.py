"""Row-wise argmax of fp32 logits in portable Triton: the greedy sampler's token for each row.

One program per row. Each lane keeps the largest key it has seen and its column, over wide
blocks whose loads are all in flight at once, and the block reduces once at the end: a decode
step's [B, vocab] logits are read once, in a few load round trips per row, where torch.argmax
takes longer at the decode shapes (see BLOCK). Semantics are torch.argmax's: the first column
of the largest value, NaN above everything (the first NaN wins), and a row of -inf gives column 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import resolve_backend
from kernels.triton_utils import new_output, ordered_key


# mirror_rows unspecialised: without a mirror it is the batch's row count, and a specialisation
# for each class of it (1, divisible by 16, other) compiled anew while serving (server/engine/warmup.py).
@triton.jit(do_not_specialize=["mirror_rows"])
def _argmax_kernel(x_ptr, out_ptr, n_cols, row_stride, mirror_ptr, mirror_index_ptr, mirror_rows, mirror_stride,
                   BLOCK: tl.constexpr, MIRROR: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = x_ptr + row * row_stride
    lanes = tl.arange(0, BLOCK)
    # Key 0 lies below every float's key (-inf's is 0x007FFFFF), so a lane that saw only masked
    # columns never wins; a lane takes a column only when it is strictly larger, which keeps the
    # first of its equal columns (a lane sees its columns in increasing order).
    best = tl.zeros((BLOCK,), tl.uint32)
    best_col = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, n_cols, BLOCK):
        col = start + lanes
        valid = col < n_cols
        x = tl.load(row_ptr + col, mask=valid, other=0.0)
        # every NaN above +inf, as torch.argmax ranks them
        key = tl.where(x != x, tl.full(x.shape, 0xFFFFFFFF, tl.uint32), ordered_key(x))
        key = tl.where(valid, key, 0)
        take = key > best
        best = tl.where(take, key, best)
        best_col = tl.where(take, col, best_col)
    top = tl.max(best, axis=0)
    token = tl.min(tl.where(best == top, best_col, n_cols), axis=0).to(tl.int64)
    tl.store(out_ptr + row, token)
    if MIRROR:
        # clamped: an index left over from other inputs writes a wrong row, never past the buffers
        index = tl.minimum(tl.maximum(tl.load(mirror_index_ptr), 0), mirror_rows - 1)
        tl.store(mirror_ptr + index * mirror_stride + row, token)


# Columns a program reads per step, and its warps (32 a thread): the widest step that stays in
# registers; one holding a whole small-model row spills (benchmarks/kernels.py --only argmax
# sweeps both).
BLOCK = 16384
NUM_WARPS = 16


def argmax_rows(logits: torch.Tensor, backend: str | None = None, out: torch.Tensor | None = None,
                mirror: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """int64 [T]: the column of each row's largest value in fp32 logits [T, V] (torch.argmax(dim=-1)),
    written into `out` (int64 [T], contiguous) when given: a decode graph writes its tokens straight
    into the buffer the next step reads them from.
    mirror (Triton only): (buffers int64 [R, >= T] with unit column stride that the device can write,
    e.g. pinned host memory; index int64 [1] on the device): the tokens are also written to
    buffers[index] (index clamped to the rows), so a graph's tokens reach the host without a copy
    of their own, into the row the step's inputs name."""
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"argmax_rows: logits must be fp32 [T, V], got {logits.dtype}{list(logits.shape)}")
    rows, n = logits.shape
    if out is None:
        out = new_output((rows,), torch.int64, logits.device)
    elif out.shape != (rows,) or out.dtype != torch.int64 or not out.is_contiguous() or out.device != logits.device:
        raise ValueError(f"argmax_rows: out must be contiguous int64 [{rows}] on {logits.device}, "
                         f"got {out.dtype}{list(out.shape)} on {out.device}")
    resolved = resolve_backend(backend, logits.device)
    torch_backend = resolved == "torch"
    if mirror is not None:
        buffers, index = mirror
        if torch_backend or buffers.dim() != 2 or buffers.shape[1] < rows or buffers.stride(1) != 1 \
                or buffers.dtype != torch.int64 or index.shape != (1,) or index.dtype != torch.int64:
            raise ValueError(f"argmax_rows: mirror must be int64 buffers [R, >= {rows}] and an int64 [1] index, "
                             f"on the triton backend; got {buffers.dtype}{list(buffers.shape)}, "
                             f"{index.dtype}{list(index.shape)}, backend {resolved}")
    if torch_backend or n == 0:
        return torch.argmax(logits, dim=-1, out=out)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    if rows:
        buffers, index = mirror if mirror is not None else (out, out)
        _argmax_kernel[(rows,)](logits, out, n, logits.stride(0), buffers, index, buffers.shape[0], buffers.stride(0),
                                BLOCK=min(BLOCK, triton.next_power_of_2(n)), MIRROR=mirror is not None,
                                num_warps=NUM_WARPS if logits.is_cuda else 4)
    return out
