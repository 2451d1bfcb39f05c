"""CUDA-graph capture and replay of the decode step, one graph per batch-size and context bucket.

A decode step launches ~1,100 kernels from Python; replaying a captured graph launches them in
one call, so the step's host cost no longer grows with the model's depth. Captured at start-up
for each bucket size (by default 1, 2, 4, 8, 16, 24, ... up to --max-num-seqs), largest first,
in one shared memory pool.

A graph replays fixed addresses and fixed launch grids, so:
- inputs live in one persistent device buffer, laid out per graph (`staged_inputs`): the pending
  tokens, then per token the id, where to read it from, position, cache slot, block-table row and
  context length (the last two as the kernels take them, int32, so the graph converts nothing),
  then the block table (as many columns as the graph's context bucket needs). One asynchronous
  copy of a pinned staging buffer's span fills all but the pending tokens each step;
- with overlapped scheduling the previous step's sampled tokens stand for placeholder ids: the
  graph gathers every id from [pending, ids] in one index op, a placeholder's from its row of
  `pending`, which spares the host the tensor ops of doing it before each replay. A decode graph
  ends with the greedy argmax of its logits written into `pending` itself, so a greedy step after
  a greedy decode step reads its tokens where they are, with no copy and no argmax launched
  outside the graph; tokens sampled otherwise (temperature, min_tokens, an eager step) are copied
  in on the device. The argmax kernel also writes the tokens to pinned host memory, into the row
  of `host_tokens` that the step's inputs name (the staging buffer's number, alternated), so a
  greedy step's tokens reach the host without a copy of their own;
- a batch of B requests runs in the smallest bucket >= B; the padding requests decode token 0
  at positions 0..q-1 of their own block-table row, which points at a dummy cache block that no
  request owns (the runner allocates it past the block manager's blocks), so they read and
  write only it;
- the indexer's logits are as wide as the graph's context bucket, and the indexer and top-k
  kernels loop up to each token's context length read on the device (kernels/indexer.py,
  kernels/topk/), so a graph serves every context up to its bucket at the cost of the
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
from dataclasses import dataclass, fields
from typing import Generic, TypeVar

import numpy as np
import torch

from kernels.argmax import argmax_rows
from kernels.topk import SINGLE_PASS_MAX_COLS
from server.engine.sequence import placeholder_row
from server.model.attention import AttentionMetadata, CacheSettings
from server.model.model import SparseMLAModel

PAD_TOKEN = 0


def default_capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, then every multiple of 8, up to the first size >= max_num_seqs (vLLM's shape)."""
    sizes = [1, 2, 4] + list(range(8, max_num_seqs + 8, 8))
    return tuple(s for i, s in enumerate(sizes) if i == 0 or sizes[i - 1] < max_num_seqs)


Array = TypeVar("Array", torch.Tensor, np.ndarray)


@dataclass(frozen=True)
class GraphInputs(Generic[Array]):
    """A graph's per-step inputs, as views of a byte buffer: torch views of the device buffer, which
    the graph reads, or numpy views of a pinned staging buffer, which the host fills."""

    host_row: Array  # int64 [1]: the row of `host_tokens` the step's sampled tokens go to
    ids: Array  # int64 [T]: token ids, placeholders (< 0) included
    source: Array  # int64 [T]: where each token's id is read in [pending, ids] (a placeholder's: its pending row)
    positions: Array  # int64 [T]
    slots: Array  # int64 [T], global cache slot of each token
    seq_ids: Array  # int32 [T], row of the block table
    context_lens: Array  # int32 [T], positions + 1
    table: Array  # int32 [B, blocks]

    def numpy(self: GraphInputs[torch.Tensor]) -> GraphInputs[np.ndarray]:
        return GraphInputs(*(getattr(self, f.name).numpy() for f in fields(self)))


@dataclass(frozen=True)
class StagedInputs:
    """A graph's inputs in a byte buffer and the bytes [start, end) that hold them, which one copy
    moves. The buffer begins with the pending tokens (int64 [pending_len], written on the device
    only) and then the token ids, so that [pending, ids] is one int64 array the graph gathers the
    step's ids from, placeholders resolved, in one index op."""

    start: int
    end: int
    views: GraphInputs[torch.Tensor]


def _fields_after_pending(rows: int, requests: int, blocks: int) -> list[tuple[torch.dtype, int]]:
    """(dtype, elements) of ids, host_row, source, positions, slots, seq_ids, context_lens, table."""
    i64, i32 = torch.int64, torch.int32
    return [(i64, rows), (i64, 1), (i64, rows), (i64, rows), (i64, rows), (i32, rows), (i32, rows),
            (i32, requests * blocks)]


def inputs_bytes(pending_len: int, rows: int, requests: int, blocks: int) -> int:
    """The byte size of a graph's inputs laid out as `staged_inputs` lays them out."""
    return pending_len * 8 + sum(d.itemsize * n for d, n in _fields_after_pending(rows, requests, blocks))


def staged_inputs(buffer: torch.Tensor, pending_len: int, rows: int, requests: int, blocks: int) -> StagedInputs:
    """Views of uint8 `buffer` laid out for a graph of `rows` tokens, `requests` requests and
    `blocks` block-table columns, after `pending_len` pending tokens."""
    at = pending_len * 8
    views = []
    for dtype, count in _fields_after_pending(rows, requests, blocks):
        views.append(buffer[at:at + count * dtype.itemsize].view(dtype))
        at += count * dtype.itemsize
    ids, host_row, source, positions, slots, seq_ids, context_lens, table = views
    return StagedInputs(pending_len * 8, at, GraphInputs(host_row, ids, source, positions, slots, seq_ids,
                                                         context_lens, table.view(requests, blocks)))


def pad_requests(inputs: GraphInputs, batch: int, size: int, q: int, dummy_block: int, block_size: int,
                 pending_len: int) -> None:
    """Requests batch..size-1 of a graph's inputs (its device buffer at capture; numpy views of the
    pinned staging buffers at replay, where numpy costs the host a fraction of a torch op): token 0
    at positions 0..q-1 of their own table row, whose first block is the dummy."""
    lo, hi = batch * q, size * q
    ids = inputs.ids
    rows = np.arange(lo, hi) if isinstance(ids, np.ndarray) else torch.arange(lo, hi, device=ids.device)
    ids[lo:hi] = PAD_TOKEN
    inputs.source[lo:hi] = pending_len + rows
    inputs.positions[lo:hi] = rows % q
    inputs.context_lens[lo:hi] = rows % q + 1
    inputs.seq_ids[lo:hi] = rows // q
    inputs.slots[lo:hi] = dummy_block * block_size + rows % q
    inputs.table[batch:size, 0] = dummy_block


def context_buckets(max_model_len: int) -> tuple[int, ...]:
    """The logits widths that decode graphs are captured for: the top-k's one-launch width, and
    max_model_len."""
    return tuple(sorted({min(SINGLE_PASS_MAX_COLS, max_model_len), max_model_len}))


class DecodeGraphs:
    """The captured decode graphs of one model and cache, and their persistent inputs.

    A graph is keyed by (requests, query tokens per request, context bucket): 1 query token for
    decode, k + 1 for speculative verification (each request's last token and its k drafts).
    A decode graph (1 query token) ends with the greedy argmax of its logits, written into
    `pending`, where the next step's placeholders are read from.
    """

    def __init__(self, model: SparseMLAModel, kv: list[torch.Tensor], indexer: list[torch.Tensor],
                 settings: CacheSettings, block_size: int, max_model_len: int, dummy_block: int,
                 sizes: tuple[int, ...], max_pending: int, query_lens: tuple[int, ...] = (1,)) -> None:
        """max_pending: the most tokens a step hands on to the next as placeholders (one per
        request; with speculative decoding also each request's drafts)."""
        self.model, self.kv, self.indexer, self.settings = model, kv, indexer, settings
        self.block_size, self.max_model_len = block_size, max_model_len
        self.dummy_block = dummy_block
        self.sizes = tuple(sorted(set(sizes)))
        self.widths = context_buckets(max_model_len)
        # padding rows decode positions 0..q-1 of the dummy block, so q must fit in one block
        self.query_lens = tuple(sorted({q for q in query_lens if 1 <= q <= block_size}))
        device = next(model.parameters()).device
        self.pending_len = max(max_pending, self.max_size)
        largest = inputs_bytes(self.pending_len, self.max_size * self.query_lens[-1], self.max_size,
                               self.table_blocks(self.widths[-1]))
        self.inputs = torch.zeros(largest, dtype=torch.uint8, device=device)
        # The last step's sampled tokens (and drafts): one per request that sampled, in any step,
        # graphed or not; decode graphs write theirs here (padding requests' too).
        self.pending = self.inputs[: self.pending_len * 8].view(torch.int64)
        # Two pinned staging buffers, alternated, so a step never overwrites one that a copy may still read;
        # the graph writes its greedy tokens to the host row of the same number (`host_tokens`), which
        # the engine reads before the step after next writes that row again.
        self._staging = [torch.zeros(largest, dtype=torch.uint8).pin_memory() for _ in range(2)]
        self.host_tokens = torch.zeros(2, self.pending_len, dtype=torch.long).pin_memory()
        # numpy views of the staging memory per (buffer, graph): a step fills them with numpy, whose
        # slice assignment costs the host about a tenth of a torch op's dispatch
        self._staging_cache: dict[tuple[int, int, int, int], tuple[slice, GraphInputs[np.ndarray]]] = {}
        self._flip = 0
        # The graph the last replay ran: its inputs are in place, so it alone can be replayed again as is.
        self.last_key: tuple[int, int, int] | None = None
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

    def _staged(self, buffer: torch.Tensor, key: tuple[int, int, int]) -> StagedInputs:
        size, q, width = key
        return staged_inputs(buffer, self.pending_len, size * q, size, self.table_blocks(width))

    def _forward(self, size: int, q: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The step over the first size x q token rows of the persistent inputs, with logits
        `width` wide: (logits, hidden, the logits' argmax in `pending` for decode, else None)."""
        inputs = self._staged(self.inputs, (size, q, width)).views
        meta = AttentionMetadata(
            positions=inputs.positions, slot_mapping=inputs.slots, seq_ids=inputs.seq_ids,
            context_lens=inputs.context_lens, block_table=inputs.table, block_size=self.block_size, logits_width=width,
        )
        # one gather from [pending, ids] puts the previous step's tokens in place of the placeholders
        pending_and_ids = self.inputs[: (self.pending_len + size * q) * 8].view(torch.int64)
        input_ids = torch.index_select(pending_and_ids, 0, inputs.source)
        hidden = self.model(input_ids, meta, self.kv, self.indexer, self.settings)
        logits = self.model.logits(hidden, self.settings.backend)  # graphs run at --tp 1 only
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
            pad_requests(self._staged(self.inputs, key).views, 0, size, q, self.dummy_block, self.block_size,
                         self.pending_len)
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

    def _staging_views(self, flip: int, key: tuple[int, int, int]) -> tuple[slice, GraphInputs[np.ndarray]]:
        """Staging buffer `flip` laid out for graph `key`: (the bytes to copy, numpy views of the inputs)."""
        cache_key = (flip, *key)
        views = self._staging_cache.get(cache_key)
        if views is None:
            staged = self._staged(self._staging[flip], key)
            views = slice(staged.start, staged.end), staged.views.numpy()
            self._staging_cache[cache_key] = views
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
        self.last_key = key
        flip, self._flip = self._flip, self._flip ^ 1
        span, host = self._staging_views(flip, key)
        n = batch * q
        host.host_row[0] = flip
        ids, pos = token_ids.numpy(), positions.numpy()
        host.ids[:n] = ids
        host.source[:n] = np.where(ids < 0, placeholder_row(ids), self.pending_len + np.arange(n))
        host.positions[:n] = pos
        host.context_lens[:n] = pos + 1
        host.seq_ids[:n] = seq_ids.numpy()
        host.slots[:n] = slots.numpy()
        # A request may hold blocks past the bucket's longest context: no kernel reads them.
        blocks = min(blocks, host.table.shape[1])
        host.table[:batch, :blocks] = block_table.numpy()[:, :blocks]
        if batch < size:
            pad_requests(host, batch, size, q, self.dummy_block, self.block_size, self.pending_len)
        self.inputs[span].copy_(self._staging[flip][span], non_blocking=True)
        if pending is not None and (self._last is None or pending is not self._last[1]):
            self.pending[: pending.shape[0]].copy_(pending)
        self.graphs[key].replay()
        logits, hidden, argmax = self.outputs[key]
        on_host = self.host_tokens[flip, :n]
        self._last = (logits[:n], None, None) if argmax is None else (logits[:n], argmax[:n], on_host)
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
