"""CUDA-graph capture and replay of the decode step, one graph per batch-size bucket.

A decode step launches ~1,100 kernels from Python; replaying a captured graph launches them in
one call, so the step's host cost no longer grows with the model's depth. Captured at start-up
for each bucket size (by default 1, 2, 4, 8, 16, 24, ... up to --max-num-seqs), largest first,
in one shared memory pool.

A graph replays fixed addresses and fixed launch grids, so:
- inputs live in persistent device buffers: per token [ids, positions, block-table row, slot]
  and the block table, filled by two asynchronous copies per step;
- a batch of B requests runs in the smallest bucket >= B; the padding rows decode token 0 at
  position 0 of their own block-table row, which points at a dummy cache block that no request
  owns (the runner allocates it past the block manager's blocks), so they read and write only it;
- the indexer's logits are max_model_len wide and the indexer and top-k kernels loop up to each
  token's context length read on the device (kernels/indexer.py, kernels/topk.py), so one graph
  per batch bucket serves every context length at the cost of the contexts actually present.

Only pure decode steps replay (one new token per request, each wanting its logits); prefill
chunks, mixed steps and speculative verification run eagerly, as does everything on CPU, with
the torch kernels, or under tensor parallelism (graphs there need every rank to replay the same
bucket in step; not built yet).
"""

from __future__ import annotations

import sys
import time

import torch

from server.model.attention import AttentionMetadata, CacheSettings
from server.model.model import SparseMLAModel

PAD_TOKEN = 0


def default_capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, then every multiple of 8, up to the first size >= max_num_seqs (vLLM's shape)."""
    sizes = [1, 2, 4] + list(range(8, max_num_seqs + 8, 8))
    return tuple(s for i, s in enumerate(sizes) if i == 0 or sizes[i - 1] < max_num_seqs)


class DecodeGraphs:
    """The captured decode graphs of one model and cache, and their persistent inputs."""

    def __init__(self, model: SparseMLAModel, kv: list[torch.Tensor], indexer: list[torch.Tensor],
                 settings: CacheSettings, block_size: int, max_model_len: int, dummy_block: int,
                 sizes: tuple[int, ...]) -> None:
        self.model, self.kv, self.indexer, self.settings = model, kv, indexer, settings
        self.block_size, self.max_model_len = block_size, max_model_len
        self.dummy_slot = dummy_block * block_size
        self.dummy_block = dummy_block
        self.sizes = tuple(sorted(set(sizes)))
        device = next(model.parameters()).device
        max_size = self.sizes[-1]
        max_blocks = -(-max_model_len // block_size)
        self.tokens = torch.zeros(max_size, 4, dtype=torch.long, device=device)  # ids, positions, row, slot
        self.block_table = torch.full((max_size, max_blocks), dummy_block, dtype=torch.int32, device=device)
        # Two pinned staging buffers, alternated, so a step never overwrites one that a copy may still read.
        self._host_tokens = [torch.zeros(max_size, 4, dtype=torch.long).pin_memory() for _ in range(2)]
        self._host_table = [torch.zeros(max_size * max_blocks, dtype=torch.int32).pin_memory() for _ in range(2)]
        self._flip = 0
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.capture_seconds = 0.0

    @property
    def max_size(self) -> int:
        return self.sizes[-1]

    def bucket(self, batch: int) -> int | None:
        """The smallest captured size >= batch, or None when the batch is larger than all."""
        return next((s for s in self.sizes if s >= batch), None)

    def _forward(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The decode step over the first `size` rows of the persistent inputs: (logits, hidden)."""
        tok = self.tokens[:size]
        positions = tok[:, 1]
        meta = AttentionMetadata(
            positions=positions, slot_mapping=tok[:, 3], seq_ids=tok[:, 2].int(),
            context_lens=(positions + 1).int(), block_table=self.block_table[:size],
            block_size=self.block_size, max_context=self.max_model_len,
        )
        hidden = self.model(tok[:, 0], meta, self.kv, self.indexer, self.settings)
        return self.model.parallel_logits(hidden), hidden

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first (later graphs reuse the pool's memory). Progress goes
        to stderr on a terminal; the summary line (sizes, seconds) always does, like the
        server's other start-up lines."""
        start = time.perf_counter()
        live = sys.stderr.isatty()
        pool = torch.cuda.graph_pool_handle()
        self._fill_padding(0, self.max_size)
        for i, size in enumerate(reversed(self.sizes)):
            self._forward(size)  # compiles the Triton kernels for this shape outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._forward(size)
            self.graphs[size] = graph
            if live:
                print(f"\rengine: capturing decode CUDA graphs {i + 1}/{len(self.sizes)} (batch {size})",
                      end="", file=sys.stderr, flush=True)
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        if live:
            print(file=sys.stderr)
        print(f"engine: captured {len(self.sizes)} decode CUDA graphs (batch sizes "
              f"{','.join(map(str, self.sizes))}) in {self.capture_seconds:.1f} s", file=sys.stderr, flush=True)

    def _fill_padding(self, batch: int, size: int) -> None:
        """Rows batch..size-1: token 0 at position 0 of their own table row, whose first block is the dummy."""
        self.tokens[batch:size] = torch.tensor([PAD_TOKEN, 0, 0, self.dummy_slot], device=self.tokens.device)
        self.tokens[batch:size, 2] = torch.arange(batch, size, device=self.tokens.device)
        self.block_table[batch:size, 0] = self.dummy_block

    def replay(self, token_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               block_table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Run one decode step of B requests (host tensors, one token each, in batch order):
        (logits fp32 [B, vocab], hidden [B, hidden]), views valid until the next replay."""
        batch, width = block_table.shape
        size = self.bucket(batch)
        host = self._host_tokens[self._flip]
        host[:batch, 0] = token_ids
        host[:batch, 1] = positions
        host[:batch, 2] = torch.arange(batch)
        host[:batch, 3] = slots
        # padding rows, as _fill_padding writes them
        host[batch:size] = torch.tensor([PAD_TOKEN, 0, 0, self.dummy_slot])
        host[batch:size, 2] = torch.arange(batch, size)
        table = self._host_table[self._flip][: size * width].view(size, width)
        table[:batch] = block_table
        table[batch:, 0] = self.dummy_block
        self._flip ^= 1
        self.tokens[:size].copy_(host[:size], non_blocking=True)
        self.block_table[:size, :width].copy_(table, non_blocking=True)
        self.graphs[size].replay()
        logits, hidden = self.outputs[size]
        return logits[:batch], hidden[:batch]
