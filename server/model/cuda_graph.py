"""CUDA-graph capture and replay of the decode step, one graph per batch-size and context bucket.

A decode step launches ~1,100 kernels from Python; replaying a captured graph launches them in
one call, so the step's host cost no longer grows with the model's depth. Captured at start-up
for each bucket size (by default 1, 2, 4, 8, 16, 24, ... up to --max-num-seqs), largest first,
in one shared memory pool.

A graph replays fixed addresses and fixed launch grids, so:
- inputs live in one persistent device buffer: per token [ids, positions, block-table row, slot]
  and then the block table (as many columns as the graph's context bucket needs), laid out per
  graph so that one asynchronous copy of a pinned staging buffer's prefix fills them each step;
- with overlapped scheduling the previous step's sampled tokens stand for placeholder ids: the
  graph puts them in place (a no-op without placeholders) from a persistent device buffer,
  `pending`, which spares the host the five tensor ops of doing it before each replay. A decode
  graph ends with the greedy argmax of its logits written into `pending` itself, so a greedy
  step after a greedy decode step reads its tokens where they are, with no copy and no argmax
  launched outside the graph; tokens sampled otherwise (temperature, min_tokens, an eager
  step) are copied in on the device. The argmax kernel also writes the tokens to pinned host
  memory, into the row of `host_tokens` that the step's inputs name (the staging buffer's
  number, alternated), so a greedy step's tokens reach the host without a copy of their own;
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
from dataclasses import dataclass

import numpy as np
import torch

from kernels.argmax import argmax_rows
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


@dataclass(frozen=True)
class StagedInputs:
    """One graph's inputs in a byte buffer (the device one, or a pinned staging one): its first
    `nbytes` hold the host row its sampled tokens go to (int64 [1]), per token [ids, positions,
    block-table row, slot] (int64 [rows, 4]) and then the block table (int32 [requests, blocks]),
    so one copy of that prefix moves a step's inputs."""

    nbytes: int
    host_row: torch.Tensor
    tokens: torch.Tensor
    table: torch.Tensor


def staged_inputs(buffer: torch.Tensor, rows: int, requests: int, blocks: int) -> StagedInputs:
    """Views of uint8 `buffer` laid out for a graph of `rows` tokens, `requests` requests and
    `blocks` block-table columns."""
    table_at = 8 + rows * 4 * 8
    nbytes = table_at + requests * blocks * 4
    tokens = buffer[8:table_at].view(torch.int64).view(rows, 4)
    table = buffer[table_at:nbytes].view(torch.int32).view(requests, blocks)
    return StagedInputs(nbytes, buffer[:8].view(torch.int64), tokens, table)


class DecodeGraphs:
    """The captured decode graphs of one model and cache, and their persistent inputs.

    A graph is keyed by (requests, query tokens per request, context bucket): 1 query token for
    decode, k + 1 for speculative verification (each request's last token and its k drafts).
    A decode graph (1 query token) ends with the greedy argmax of its logits, written into
    `pending`, where the next step's placeholders are read from.
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
        largest = staged_inputs(torch.empty(0, dtype=torch.uint8), self.max_size * self.query_lens[-1],
                                self.max_size, self.table_blocks(self.widths[-1])).nbytes
        self.inputs = torch.zeros(largest, dtype=torch.uint8, device=device)
        # The last step's sampled tokens: one per request that sampled, in any step, graphed or not;
        # decode graphs write theirs here (padding requests' too).
        self.pending = torch.zeros(max(max_num_seqs, self.max_size), dtype=torch.long, device=device)
        # Two pinned staging buffers, alternated, so a step never overwrites one that a copy may still read;
        # the graph writes its greedy tokens to the host row of the same number (`host_tokens`), which
        # the engine reads before the step after next writes that row again.
        self._staging = [torch.zeros(largest, dtype=torch.uint8).pin_memory() for _ in range(2)]
        self.host_tokens = torch.zeros(2, self.pending.shape[0], dtype=torch.long).pin_memory()
        # numpy views of the staging memory per (buffer, graph): a step fills them with numpy, whose
        # slice assignment costs the host about a tenth of a torch op's dispatch
        self._staged: dict[tuple[int, int, int, int], tuple[torch.Tensor, np.ndarray, np.ndarray]] = {}
        self._flip = 0
        self.graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}
        # The last replay's logits, their argmax on the device and on the host (the views handed
        # out), for `argmax_of` and `argmax_on_host`.
        self._last: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None = None
        self.capture_seconds = 0.0

    @property
    def max_size(self) -> int:
        return self.sizes[-1]

    def table_blocks(self, width: int) -> int:
        """Block-table columns of the graphs for contexts up to `width`: a graph's kernels read no
        block past its longest context."""
        return -(-width // self.block_size)

    def bucket(self, batch: int) -> int | None:
        """The smallest captured size >= batch, or None when the batch is larger than all."""
        return next((s for s in self.sizes if s >= batch), None)

    def width(self, max_context: int) -> int:
        """The smallest context bucket >= max_context."""
        return next(w for w in self.widths if w >= max_context)

    def fits(self, batch: int, query_len: int) -> bool:
        return batch <= self.max_size and query_len in self.query_lens

    def _device_inputs(self, size: int, q: int, width: int) -> StagedInputs:
        return staged_inputs(self.inputs, size * q, size, self.table_blocks(width))

    def _forward(self, size: int, q: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The step over the first size x q token rows of the persistent inputs, with logits
        `width` wide: (logits, hidden, the logits' argmax in `pending` for decode, else None)."""
        inputs = self._device_inputs(size, q, width)
        tok = inputs.tokens
        positions = tok[:, 1]
        meta = AttentionMetadata(
            positions=positions, slot_mapping=tok[:, 3], seq_ids=tok[:, 2].int(),
            context_lens=(positions + 1).int(), block_table=inputs.table,
            block_size=self.block_size, max_context=width,
        )
        hidden = self.model(fill_placeholders(tok[:, 0], self.pending), meta, self.kv, self.indexer, self.settings)
        logits = self.model.parallel_logits(hidden, self.settings.backend)
        argmax = None if q != 1 else argmax_rows(logits, self.settings.backend, out=self.pending[:size],
                                                 mirror=(self.host_tokens, inputs.host_row))
        return logits, hidden, argmax

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
            inputs = self._device_inputs(*key)
            pad_requests(inputs.tokens, inputs.table, 0, size, q, self.dummy_block, self.block_size)
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

    def _staging_views(self, key: tuple[int, int, int]) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """This step's staging buffer laid out for graph `key`: (the bytes to copy, the tokens and
        the table as numpy views), with the host row for the step's tokens filled in."""
        views = self._staged.get((self._flip, *key))
        if views is None:
            size, q, width = key
            host = self._staging[self._flip]
            staged = staged_inputs(host, size * q, size, self.table_blocks(width))
            staged.host_row.fill_(self._flip)
            views = host[: staged.nbytes], staged.tokens.numpy(), staged.table.numpy()
            self._staged[(self._flip, *key)] = views
        return views

    def replay(self, token_ids: torch.Tensor, positions: torch.Tensor, seq_ids: torch.Tensor, slots: torch.Tensor,
               block_table: torch.Tensor, max_context: int,
               pending: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run one step of B requests with q tokens each (host tensors, request-major as the runner
        builds them) whose longest context is max_context: (logits fp32 [B x q, vocab], hidden
        [B x q, hidden]), views valid until the next replay. pending: the sampled tokens (device)
        that placeholder token ids stand for.
        The step's inputs reach the device in one copy; when `pending` is the last replay's argmax
        (`argmax_of`), the graph reads it where it wrote it, with no copy."""
        batch, blocks = block_table.shape
        q = token_ids.shape[0] // batch
        size = self.bucket(batch)
        assert size is not None, f"DecodeGraphs.replay: batch {batch} is larger than every captured size"
        key = size, q, self.width(max_context)
        host, tokens_np, table_np = self._staging_views(key)
        host_tokens = self.host_tokens[self._flip]
        self._flip ^= 1
        n = batch * q
        for column, values in enumerate((token_ids, positions, seq_ids, slots)):
            tokens_np[:n, column] = values.numpy()
        # A request may hold blocks past the bucket's longest context: no kernel reads them.
        blocks = min(blocks, table_np.shape[1])
        table_np[:batch, :blocks] = block_table.numpy()[:, :blocks]
        if batch < size:
            pad_requests(tokens_np, table_np, batch, size, q, self.dummy_block, self.block_size)
        self.inputs[: host.shape[0]].copy_(host, non_blocking=True)
        if pending is not None and (self._last is None or pending is not self._last[1]):
            self.pending[: pending.shape[0]].copy_(pending)
        self.graphs[key].replay()
        logits, hidden, argmax = self.outputs[key]
        self._last = (logits[:n], None, None) if argmax is None else (logits[:n], argmax[:n], host_tokens[:n])
        return self._last[0], hidden[:n]

    def argmax_of(self, logits: torch.Tensor) -> torch.Tensor | None:
        """The argmax of each row of `logits` (int64, on the device) when they are the last replay's
        and its graph computed it (decode), else None. The tensor is a view of `pending`: the next
        replay reads it there without a copy, and overwrites it."""
        if self._last is None or logits is not self._last[0]:
            return None
        return self._last[1]

    def argmax_on_host(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """The host copy of `tokens` when they are the last replay's argmax (`argmax_of`): the graph
        wrote it to pinned memory itself, readable once the replay is done, until the replay after
        next. None otherwise."""
        if self._last is None or self._last[1] is None or tokens is not self._last[1]:
            return None
        return self._last[2]
