"""CUDA-graph capture and replay of the decode step, one graph per batch-size and context bucket.

A decode step launches ~1,100 kernels from Python; replaying a captured graph launches them in
one call, so the step's host cost no longer grows with the model's depth. Captured at start-up
for each bucket size (by default 1, 2, 4, 8, 16, 24, ... up to --max-num-seqs), largest first,
in one shared memory pool.

A graph replays fixed addresses and fixed launch grids, so:
- inputs live in persistent device buffers: per token [ids, positions, block-table row, slot]
  and the block table, filled by two asynchronous copies per step, and with overlapped
  scheduling the previous step's sampled tokens, copied on the device; the graph itself puts
  them in place of the placeholder ids (a no-op without placeholders), which spares the host
  the five tensor ops of doing it before each replay;
- a batch of B requests runs in the smallest bucket >= B; the padding requests decode token 0
  at positions 0..q-1 of their own block-table row, which points at a dummy cache block that no
  request owns (the runner allocates it past the block manager's blocks), so they read and
  write only it;
- the indexer's logits are as wide as the graph's context bucket, and the indexer and top-k
  kernels loop up to each token's context length read on the device (kernels/indexer.py,
  kernels/topk.py), so a graph serves every context up to its bucket at the cost of the
  contexts actually present. The top-k picks its launch shape by the logits' width, and rows up
  to `SINGLE_PASS_MAX_COLS` wide take its one-launch kernel, so each batch bucket has a graph for
  contexts up to that width and one for the rest, up to max_model_len (`context_buckets`).

Inside a capture, a layer's attention runs its latent side (KV row, q_pe's rotation, W_UK) on a
side stream beside its indexer side (key, logits, top-k, slots) at up to 32 tokens
(server/model/attention.py, BRANCH_MAX_TOKENS; server/model/layers.GraphBranch): the graph holds
the two as parallel branches; an eager step runs them one after the other, with the same numbers.

Steps replay when every request computes the same number of tokens q and wants all their
logits: decode (q = 1) and, with speculative decoding, verification of k drafts (q = k + 1);
prefill chunks, mixed steps and ragged verification run eagerly, as does everything on CPU,
with the torch kernels, or under tensor parallelism (graphs there need every rank to replay the
same bucket in step; not built yet).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from kernels.topk import SINGLE_PASS_MAX_COLS
from server.engine.pending import fill_placeholders
from server.model.attention import AttentionMetadata, CacheSettings
from server.model.model import SparseMLAModel

PAD_TOKEN = 0


def default_capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, then every multiple of 8, up to the first size >= max_num_seqs (vLLM's shape)."""
    sizes = [1, 2, 4] + list(range(8, max_num_seqs + 8, 8))
    return tuple(s for i, s in enumerate(sizes) if i == 0 or sizes[i - 1] < max_num_seqs)


def pad_requests(tokens: torch.Tensor | np.ndarray, table: torch.Tensor | np.ndarray, batch: int, size: int, q: int,
                 dummy_block: int, block_size: int) -> None:
    """Requests batch..size-1 of a graph's inputs (its device buffers at capture; numpy views of the
    pinned staging buffers at replay, where numpy costs the host a fraction of a torch op): token 0
    at positions 0..q-1 of their own table row, whose first block is the dummy."""
    lo, hi = batch * q, size * q
    rows = np.arange(lo, hi) if isinstance(tokens, np.ndarray) else torch.arange(lo, hi, device=tokens.device)
    tokens[lo:hi, 0] = PAD_TOKEN
    tokens[lo:hi, 1] = rows % q
    tokens[lo:hi, 2] = rows // q
    tokens[lo:hi, 3] = dummy_block * block_size + rows % q
    table[batch:size, 0] = dummy_block


def context_buckets(max_model_len: int) -> tuple[int, ...]:
    """The logits widths that decode graphs are captured for: the top-k's one-launch width, and
    max_model_len."""
    return tuple(sorted({min(SINGLE_PASS_MAX_COLS, max_model_len), max_model_len}))


class DecodeGraphs:
    """The captured decode graphs of one model and cache, and their persistent inputs.

    A graph is keyed by (requests, query tokens per request, context bucket): 1 query token for
    decode, k + 1 for speculative verification (each request's last token and its k drafts).
    """

    def __init__(self, model: SparseMLAModel, kv: list[torch.Tensor], indexer: list[torch.Tensor],
                 settings: CacheSettings, block_size: int, max_model_len: int, dummy_block: int,
                 sizes: tuple[int, ...], max_num_seqs: int, query_lens: tuple[int, ...] = (1,)) -> None:
        self.model, self.kv, self.indexer, self.settings = model, kv, indexer, settings
        self.block_size, self.max_model_len = block_size, max_model_len
        self.dummy_block = dummy_block
        self.sizes = tuple(sorted(set(sizes)))
        self.widths = context_buckets(max_model_len)
        # padding rows decode positions 0..q-1 of the dummy block, so q must fit in one block
        self.query_lens = tuple(sorted({q for q in query_lens if 1 <= q <= block_size}))
        device = next(model.parameters()).device
        max_rows = self.max_size * self.query_lens[-1]
        max_blocks = -(-max_model_len // block_size)
        self.tokens = torch.zeros(max_rows, 4, dtype=torch.long, device=device)  # ids, positions, table row, slot
        self.block_table = torch.full((self.max_size, max_blocks), dummy_block, dtype=torch.int32, device=device)
        # The last step's sampled tokens: one per request that sampled, in any step, graphed or not.
        self.pending = torch.zeros(max_num_seqs, dtype=torch.long, device=device)
        # Two pinned staging buffers, alternated, so a step never overwrites one that a copy may still read.
        self._host_tokens = [torch.zeros(max_rows, 4, dtype=torch.long).pin_memory() for _ in range(2)]
        self._host_table = [torch.zeros(self.max_size * max_blocks, dtype=torch.int32).pin_memory() for _ in range(2)]
        # numpy views of the same memory: a step fills them with numpy, whose slice assignment costs
        # the host about a tenth of a torch op's dispatch
        self._host_tokens_np = [t.numpy() for t in self._host_tokens]
        self._host_table_np = [t.numpy() for t in self._host_table]
        self._flip = 0
        self.graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.capture_seconds = 0.0

    @property
    def max_size(self) -> int:
        return self.sizes[-1]

    def bucket(self, batch: int) -> int | None:
        """The smallest captured size >= batch, or None when the batch is larger than all."""
        return next((s for s in self.sizes if s >= batch), None)

    def width(self, max_context: int) -> int:
        """The smallest context bucket >= max_context."""
        return next(w for w in self.widths if w >= max_context)

    def fits(self, batch: int, query_len: int) -> bool:
        return batch <= self.max_size and query_len in self.query_lens

    def _forward(self, size: int, q: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The step over the first size x q token rows of the persistent inputs, with logits
        `width` wide: (logits, hidden)."""
        tok = self.tokens[: size * q]
        positions = tok[:, 1]
        meta = AttentionMetadata(
            positions=positions, slot_mapping=tok[:, 3], seq_ids=tok[:, 2].int(),
            context_lens=(positions + 1).int(), block_table=self.block_table[:size],
            block_size=self.block_size, max_context=width,
        )
        hidden = self.model(fill_placeholders(tok[:, 0], self.pending), meta, self.kv, self.indexer, self.settings)
        return self.model.parallel_logits(hidden, self.settings.backend), hidden

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every (size, query length, context bucket), largest first (later graphs reuse the
        pool's memory).
        Progress goes to stderr on a terminal; the summary line (sizes, seconds) always does, like
        the server's other start-up lines."""
        start = time.perf_counter()
        live = sys.stderr.isatty()
        pool = torch.cuda.graph_pool_handle()
        keys = [(size, q, w) for w in reversed(self.widths) for q in reversed(self.query_lens)
                for size in reversed(self.sizes)]
        for i, key in enumerate(keys):
            size, q, width = key
            pad_requests(self.tokens, self.block_table, 0, size, q, self.dummy_block, self.block_size)
            self._forward(*key)  # compiles the Triton kernels for this shape outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[key] = self._forward(*key)
            self.graphs[key] = graph
            if live:
                print(f"\rengine: capturing CUDA graphs {i + 1}/{len(keys)} (batch {size} x {q} tokens, "
                      f"contexts up to {width})", end="", file=sys.stderr, flush=True)
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        if live:
            print(file=sys.stderr)
        verify = "" if self.query_lens == (1,) else f", query tokens {','.join(map(str, self.query_lens))}"
        print(f"engine: captured {len(keys)} CUDA graphs (batch sizes {','.join(map(str, self.sizes))}{verify}, "
              f"contexts up to {','.join(map(str, self.widths))}) in {self.capture_seconds:.1f} s",
              file=sys.stderr, flush=True)

    def replay(self, token_ids: torch.Tensor, positions: torch.Tensor, seq_ids: torch.Tensor, slots: torch.Tensor,
               block_table: torch.Tensor, max_context: int,
               pending: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run one step of B requests with q tokens each (host tensors, request-major as the runner
        builds them) whose longest context is max_context: (logits fp32 [B x q, vocab], hidden
        [B x q, hidden]), views valid until the next replay. pending: the sampled tokens (device)
        that placeholder token ids stand for."""
        batch, width = block_table.shape
        q = token_ids.shape[0] // batch
        size = self.bucket(batch)
        host, host_np = self._host_tokens[self._flip], self._host_tokens_np[self._flip]
        n = batch * q
        for column, values in enumerate((token_ids, positions, seq_ids, slots)):
            host_np[:n, column] = values.numpy()
        table = self._host_table[self._flip][: size * width].view(size, width)
        table_np = self._host_table_np[self._flip][: size * width].reshape(size, width)
        table_np[:batch] = block_table.numpy()
        if batch < size:
            pad_requests(host_np, table_np, batch, size, q, self.dummy_block, self.block_size)
        self._flip ^= 1
        self.tokens[: size * q].copy_(host[: size * q], non_blocking=True)
        self.block_table[:size, :width].copy_(table, non_blocking=True)
        if pending is not None:
            self.pending[: pending.shape[0]].copy_(pending)
        key = size, q, self.width(max_context)
        self.graphs[key].replay()
        logits, hidden = self.outputs[key]
        return logits[:n], hidden[:n]
