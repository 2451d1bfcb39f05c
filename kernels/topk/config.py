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

# Rows up to this many columns take the single launch with the row in registers, one program per
# row, which beats the multi-launch paths until a row is long enough for the (rows x programs)
# spread to pay: in a CUDA graph on an H200 (benchmarks/RESULTS.md, top-k with the row in
# registers; benchmarks/kernels.py --only topk times every path) 8.0 vs 16.7 us (compacting) and
# 22.1 (one-launch radix) at 1 x 4150 columns of length 4096, k=512 (the small model's decode rows),
# 10.7 vs 22.7 and 22.4 at 128 such rows, 11.6 vs 16.2 at 1 x 8192, k=2048, but 17.0 vs 16.5 at
# 1 x 16,384, all with the kernel's earlier bisection search (the interpolation search since: 6.8,
# 8.0 and 8.9 us at the first three; top-k: fewer search steps).
SINGLE_PASS_MAX_COLS = 8192


# Warps of that program: 8 beat 4 and 16 at every shape up to 8192 columns but 128 x 4096 with k=2048
# (12.2 vs 11.6 at 4 warps).
SINGLE_PASS_WARPS = 8


# Longer rows take the sampled path when the batch holds more than this many columns in all (rows
# x columns), else the compacting path. The sampled path's three launches each wait on a chain of
# block-wide reductions in one program per row (~20 us in all for one row), so it wins once the
# compacting path's full-row passes take longer: on an H200 (benchmarks/RESULTS.md, top-k from a
# sample), positions replayed in a CUDA graph, compacting vs sampled, 18.2 vs 20.4 us at 1 x 16,384
# and 17.7 vs 19.5 at 1 x 32,768 (length 4,096), k 512; 18.7 vs 19.1 at 8 x 8,320 (as cache
# slots, what the engine asks for, 20.0 vs 19.1); 33.2 vs 25.8 at 16 x 65,536 and 77.0 vs 31.6 at
# 64 x 65,536, k 2,048.
SAMPLED_MIN_COLUMNS = 1 << 16


# The compacting path takes rows up to this many columns with 1,024-column chunks at 16
# programs/SM, longer rows with 2,048-column chunks at 8/SM (default_config; the measurements are
# beside it).
FINE_CHUNK_MAX_COLS = 32768


# Entries per row of the compacting path's candidate list. In the H200 runs the 16-bit prefix bin
# held ~36 of 65,536 columns of ReLU'd normal logits; a row whose bin outgrows the list still
# comes out exact, but one program then reads the row (0.36-0.41 ms at 64k), hence a generous list.
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
    # On CPU the kernel runs in the Triton interpreter, whose cost grows with the number of programs
    # (measured: 2 rows of 2600 columns, k=2048 take 20 s at 64-column chunks, 5.7 s at 256); 256
    # still splits the tests' rows of 700 columns into several chunks of several blocks each. The
    # paths are the GPU's, so that what runs by default in the interpreter is what a GPU runs.
    sampled = n_rows * n_cols > SAMPLED_MIN_COLUMNS
    if device.type != "cuda":
        return TopkConfig(256, 64, 4, finish_block=64, sample=SAMPLE_COLS if sampled else 0)
    # Fastest per shape replayed in a CUDA graph on an H200 (benchmarks/RESULTS.md, top-k launch
    # shapes, compacting top-k, top-k with the row in registers): one program per row holding the
    # row in registers up to 8k columns (SINGLE_PASS_MAX_COLS has the numbers; the block and chunk
    # below serve only a radix single launch); the compacting path beyond, with 1024-column chunks
    # at 16 programs/SM up to 32k
    # (16.1 and 29.1 us at 1 and 128 rows of 32k at 4k context, k=512, where the five launches
    # took 21.3 and 53.0), 2048-column chunks at 8/SM beyond (29.8 vs 45.6 us at 16 x 64k, 80.1 vs
    # 142.0 at 64 x 64k); the finish steps 512 candidates at a time (2 us less than 1024 there).
    # Beyond 32k the histogram levels step 2,048 columns (29.1 vs 29.9 us at 16 x 64k, 74.5 vs 80.1
    # at 64 x 64k; at 32k columns and 4k context they lost, 17.2 vs 16.0 and 30.5 vs 29.1).
    # Batches past SAMPLED_MIN_COLUMNS take the sampled path instead, its mark pass in 2,048-column
    # chunks at 16 programs/SM (25.8 us at 16 x 64k, 31.6 at 64 x 64k; 1,024-column chunks 25.2-25.8
    # and 31.5-31.6: the same within the runs' spread), its sample SAMPLE_COLS and list CANDIDATES
    # (a sample of 4,096 and a list of 8,192: 27.9-28.1 and 32.0-32.4).
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
