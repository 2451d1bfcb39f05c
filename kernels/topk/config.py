"""Top-k launch shapes: `TopkConfig` (chunks, blocks, warps and programs per multiprocessor, and
which path takes a row) and `default_config`, the choice per device, row count and row width. The
constants name the widths where the choice changes; `benchmarks/kernels.py --only topk` and
`--only topk_slots` time the paths at these shapes, `benchmarks/topk_determinism.py` the wide ones."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from kernels.topk.in_registers import REGISTER_ROW_MAX_COLS
from kernels.triton_utils import row_programs

# Rows up to this many columns take the single launch with the row in registers: one program per
# row waits on no further launch, which wins until rows are long enough for the multi-launch paths'
# (rows x programs) spread to pay, as they are past this width (`benchmarks/kernels.py --only topk`
# times both launch shapes up to REGISTER_ROW_MAX_COLS).
SINGLE_PASS_MAX_COLS = 8192
# Warps of that program, and of the sampled path's programs that hold a row's sample or list in
# registers: chosen by the same sweep, at the decode shapes.
SINGLE_PASS_WARPS = 8
# Longer rows take the sampled path when the batch holds more than this many columns in all (rows
# x columns), else the compacting path. The sampled path's three launches each wait on a chain of
# block-wide reductions in one program per row, a cost that does not grow with the batch, while the
# compacting path's full-row passes do: past about this many columns the sampled path is the faster
# (`benchmarks/topk_determinism.py` times both).
SAMPLED_MIN_COLUMNS = 1 << 16
# The compacting path takes rows up to this many columns with fine chunks, longer rows with coarse
# chunks and wider histogram steps (default_config says why).
FINE_CHUNK_MAX_COLS = 32768
# Entries per row of the compacting path's candidate list (and of the sampled path's list of
# marked columns). The 16-bit prefix bin of continuous logits holds a small share of a row (tens of
# columns in 65,536 for ReLU'd normal logits); a row whose bin outgrows the list still comes out
# exact, but one program then reads the whole row, hence a generous list.
CANDIDATES = 4096
# The sampled path's sample: up to this many columns of a row, one drawn from each window of
# cdiv(length, SAMPLE_COLS) columns.
SAMPLE_COLS = 8192


@dataclass(frozen=True)
class TopkConfig:
    """Columns per chunk, columns per loop step (block), warps and programs per multiprocessor
    (the grid) of the multi-launch paths, and the longest row that takes the single launch, one
    program per row of num_warps warps holding the row in registers (at most REGISTER_ROW_MAX_COLS).

    Longer rows take the compacting path with a candidate list of `candidates` entries per row;
    its finish steps `finish_block` entries at a time. Its full-row histogram levels step
    `hist_block` columns at a time (0: `block`; their chunks grow to it): a histogram's per-step
    cost (ballots, a barrier, a shared-memory merge) is shared by more columns, while the split
    keeps the smaller block. The compacting path's finish puts each row's columns in ascending
    order (`_order_by_bitmap`).

    With `sample` > 0, rows past the single launch take the sampled path instead (a sample of up
    to `sample` columns per row, a power of two), whose finish lists up to `candidates` columns
    per row (a power of two: its register block) and which needs candidates >= 2 k (else the
    compacting path); its mark pass steps `block` columns (a multiple of 32) in chunks of `chunk`.
    """

    chunk: int
    block: int
    num_warps: int
    programs_per_sm: int = 4
    single_pass_max_cols: int = SINGLE_PASS_MAX_COLS
    candidates: int = CANDIDATES
    finish_block: int = 512
    hist_block: int = 0
    sample: int = 0

    def __post_init__(self) -> None:
        # the split's scan packs two per-block counts into one int32, the above-count in the high
        # half, which must stay below 2^15 (a whole block above the prefix) to keep the sign bit clear
        if self.block >= 1 << 15:
            raise ValueError(f"TopkConfig: block={self.block} must be below 32768")
        if self.hist_block < 0:
            raise ValueError(f"TopkConfig: hist_block={self.hist_block} must be >= 0")
        if self.candidates <= 0:
            raise ValueError(f"TopkConfig: candidates={self.candidates} must be positive")
        if self.single_pass_max_cols > REGISTER_ROW_MAX_COLS:
            raise ValueError(f"TopkConfig: single_pass_max_cols={self.single_pass_max_cols} must be at most "
                             f"{REGISTER_ROW_MAX_COLS}, the longest row the one-launch kernel holds")
        if self.sample:
            for name in ("sample", "candidates"):
                value = getattr(self, name)
                if value <= 0 or value & (value - 1):
                    raise ValueError(f"TopkConfig: {name}={value} must be a power of two on the sampled path")
            if self.block % 32 or self.chunk % self.block:
                raise ValueError(f"TopkConfig: the sampled path needs a block ({self.block}) of whole 32-column "
                                 f"words and chunks ({self.chunk}) of whole blocks")

    def grid(self, rows: int, n_cols: int, chunk: int, device: torch.device) -> tuple[int, int]:
        """(rows, programs per row) of a pass over chunks of `chunk` columns."""
        return rows, row_programs(rows, max(1, triton.cdiv(n_cols, chunk)), device, self.programs_per_sm)


def default_config(device: torch.device, n_cols: int, n_rows: int) -> TopkConfig:
    """The launch shapes for a batch of n_rows rows of n_cols columns, from the shapes alone.

    On a GPU, rows up to SINGLE_PASS_MAX_COLS take the one-launch kernel (the chunk and block then
    serve no launch). Longer rows in batches of more than SAMPLED_MIN_COLUMNS columns take the
    sampled path, its mark pass in 2,048-column chunks at 16 programs/SM. Smaller batches take the
    compacting path: up to FINE_CHUNK_MAX_COLS columns in 1,024-column chunks at 16 programs/SM, so
    that a few such rows still spread over every multiprocessor; beyond, in 2,048-column chunks at
    8/SM with histogram levels stepping 2,048 columns, whose fixed cost per step (ballots, a
    barrier, a merge) only pays back over long rows. Each grid is the fastest that
    `benchmarks/kernels.py --only topk` and `benchmarks/topk_determinism.py` found at the shapes the
    engine asks for.

    On CPU the kernels run in the Triton interpreter, whose cost grows with the number of programs:
    256-column chunks keep it affordable and still split the tests' rows of 700 columns into several
    chunks of several blocks each. The paths are the GPU's, so that what runs by default in the
    interpreter is what a GPU runs.
    """
    sampled = n_rows * n_cols > SAMPLED_MIN_COLUMNS
    if device.type != "cuda":
        return TopkConfig(256, 64, 4, finish_block=64, sample=SAMPLE_COLS if sampled else 0)
    if n_cols <= SINGLE_PASS_MAX_COLS:
        return TopkConfig(4096, 4096, SINGLE_PASS_WARPS)
    if sampled:
        return TopkConfig(2048, 1024, 4, 16, sample=SAMPLE_COLS)
    if n_cols <= FINE_CHUNK_MAX_COLS:
        return TopkConfig(1024, 1024, 4, 16)
    return TopkConfig(2048, 1024, 4, 8, hist_block=2048)


def takes_register_launch(cfg: TopkConfig, n_cols: int) -> bool:
    """Whether rows of n_cols columns take the in-register one-launch kernel under cfg."""
    return n_cols <= cfg.single_pass_max_cols
