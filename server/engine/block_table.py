"""The batch's block table on the host, kept between steps so that a step rewrites only the rows
that changed.

Row i of a step's table lists the cache blocks of the batch's i-th request, zero-padded to the
longest, and the width to a multiple of TABLE_WIDTH_MULTIPLE: the table's row stride is a kernel
argument, and Triton compiles a kernel anew for an integer argument that changes between divisible
by 16 and not (server/engine/warmup.py). A decode step's batch is mostly the previous step's
requests in the same order, each holding the same blocks (a new block every `block_size`
tokens), so the table of the last step is kept with the (request, block epoch, block count) that
each row holds, and only rows where these differ are written. A request's block ids are kept too,
as an int32 array that stays valid while its block epoch holds (its block list only grows at the
end until the epoch changes), so even a rewritten row copies an array instead of converting every
block id from Python ints (at 64k tokens a request has ~1,000 blocks).
"""

from __future__ import annotations

import weakref

import numpy as np

from server.engine.sequence import Sequence

RowKey = tuple[Sequence, int, int]  # the request, its block epoch, its block count
HeldKey = tuple[Sequence | None, int, int]  # a row's last key; None: its request left the batch
TABLE_WIDTH_MULTIPLE = 16


class _RequestBlocks:
    """A request's block ids as a growing int32 array, valid while its block epoch holds."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.ids = np.empty(16, dtype=np.int32)
        self.count = 0

    def extend(self, block_ids: list[int]) -> np.ndarray:
        """The first len(block_ids) entries, after appending the ones added since the last call."""
        n = len(block_ids)
        if n > self.ids.shape[0]:
            grown = np.empty(max(n, 2 * self.ids.shape[0]), dtype=np.int32)
            grown[: self.count] = self.ids[: self.count]
            self.ids = grown
        if n > self.count:
            self.ids[self.count : n] = block_ids[self.count : n]
        self.count = n
        return self.ids[:n]


class BlockTable:
    def __init__(self) -> None:
        self._requests: weakref.WeakKeyDictionary[Sequence, _RequestBlocks] = weakref.WeakKeyDictionary()
        self._table = np.zeros((0, 0), dtype=np.int32)
        self._held: list[HeldKey | None] = []  # what each row of _table holds (None: zeros)
        self._rows_used = 0  # the last batch's size

    def build(self, seqs: tuple[Sequence, ...]) -> np.ndarray:
        """int32 [B, max blocks rounded up to TABLE_WIDTH_MULTIPLE] of the batch, zero-padded; a new
        array the caller may keep."""
        keys: list[RowKey] = [(s, s.block_epoch, len(s.block_ids)) for s in seqs]
        width = -(-max(n for _, _, n in keys) // TABLE_WIDTH_MULTIPLE) * TABLE_WIDTH_MULTIPLE
        rows, cols = self._table.shape
        if len(keys) > rows or width > cols:
            # each dimension grows only when it is short; the width by doubling, as rows gain blocks
            self._table = np.zeros((max(len(keys), rows), cols if width <= cols else max(width, 2 * cols)),
                                   dtype=np.int32)
            self._held = [None] * self._table.shape[0]
        for i, key in enumerate(keys):
            held = self._held[i]
            if held != key:
                self._write_row(i, key, 0 if held is None else held[2])
                self._held[i] = key
        for i in range(len(keys), self._rows_used):  # rows the batch left: drop their requests, keep their extent
            held = self._held[i]
            if held is not None:
                self._held[i] = (None, -1, held[2])
        self._rows_used = len(keys)
        return self._table[: len(keys), :width].copy()

    def _write_row(self, i: int, key: RowKey, held_count: int) -> None:
        seq, epoch, n = key
        blocks = self._requests.get(seq)
        if blocks is None or blocks.epoch != epoch:
            blocks = self._requests[seq] = _RequestBlocks(epoch)
        self._table[i, :n] = blocks.extend(seq.block_ids)
        if held_count > n:
            self._table[i, n:held_count] = 0
