"""The paged KV cache: the cache tensors, and the block manager that hands their blocks out.

Per layer there are two tensors addressed by global slot = block_id * block_size + offset:
the latent KV rows `[c ; k_pe]` (bf16, or the fp8_ds_mla byte layout) and the indexer keys (fp8 +
scale, or MXFP4), one row of bytes per block: the block's keys' values, then their scale words
(kernels/quant.py). A block is `block_size` consecutive slots in every layer at once.

The block manager keeps each block's reference count. Full blocks whose KV has been computed get
a chained hash (hash of the parent block's hash and the block's tokens), so a later request with
the same token prefix maps the same blocks instead of recomputing them. A block whose count
drops to zero joins the free queue but keeps its hash until it is handed out again; the queue is
least-recently-freed first, so cached blocks are evicted LRU. Invariant: free + in use == total.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from kernels.quant import indexer_row_bytes, kv_row_bytes, kv_row_width
from server.config import CacheConfig, EngineConfig, ModelConfig
from server.engine.sequence import Sequence


def kernel_kv_dtype(cache: CacheConfig) -> str:
    """The kernels' name for the configured KV row layout (--kv-cache-dtype fp8 = fp8_ds_mla)."""
    return "bf16" if cache.kv_cache_dtype == "bf16" else "fp8_ds_mla"


def cache_bytes_per_token(model: ModelConfig, cache: CacheConfig) -> int:
    """Bytes one token occupies over all layers: latent KV row plus indexer key row."""
    per_layer = (kv_row_bytes(model.kv_lora_rank, model.qk_rope_dim, kernel_kv_dtype(cache))
                 + indexer_row_bytes(model.index_head_dim, cache.indexer_key_dtype))
    return per_layer * model.num_layers


@dataclass
class KVCacheTensors:
    """Per layer: KV rows [num_slots, kv_row] and indexer key blocks [num_blocks, block_size * idx_row]."""

    kv: list[torch.Tensor]
    indexer: list[torch.Tensor]
    num_blocks: int
    block_size: int

    @classmethod
    def allocate(cls, config: EngineConfig, num_blocks: int, device: torch.device) -> KVCacheTensors:
        model, cache, block_size = config.model, config.cache, config.block_size
        slots = num_blocks * block_size
        kv_dtype = torch.bfloat16 if cache.kv_cache_dtype == "bf16" else torch.uint8
        width = kv_row_width(model.kv_lora_rank, model.qk_rope_dim, kernel_kv_dtype(cache))
        kv = [torch.zeros(slots, width, dtype=kv_dtype, device=device) for _ in range(model.num_layers)]
        idx_width = indexer_row_bytes(model.index_head_dim, cache.indexer_key_dtype)
        indexer = [torch.zeros(num_blocks, block_size * idx_width, dtype=torch.uint8, device=device)
                   for _ in range(model.num_layers)]
        return cls(kv=kv, indexer=indexer, num_blocks=num_blocks, block_size=block_size)


def hash_block(parent_hash: int | None, tokens: list[int]) -> int:
    return hash((parent_hash, tuple(tokens)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        if num_blocks <= 0:
            raise ValueError(f"KV cache: need at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.hash_to_block: dict[int, int] = {}
        # Insertion order = order freed; the head is evicted first (LRU).
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.num_in_use = 0

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return self.num_in_use / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def prefix_hit(self, seq: Sequence) -> list[int]:
        """Cached blocks matching seq's leading full blocks; always leaves one token to compute."""
        if not self.enable_prefix_caching:
            return []
        max_blocks = (len(seq) - 1) // self.block_size
        hits: list[int] = []
        parent: int | None = None
        for i in range(max_blocks):
            parent = hash_block(parent, seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
            block = self.hash_to_block.get(parent)
            if block is None:
                break
            hits.append(block)
        return hits

    def can_admit(self, seq: Sequence, hits: list[int], num_new_tokens: int) -> bool:
        """Whether seq, mapped onto `hits`, can get blocks for `num_new_tokens` more tokens."""
        cached_tokens = len(hits) * self.block_size
        new_blocks = self.blocks_needed(cached_tokens + num_new_tokens) - len(hits)
        hits_now_free = sum(1 for b in hits if self.ref_counts[b] == 0)
        return new_blocks + hits_now_free <= self.num_free_blocks

    # ---- changes -------------------------------------------------------------------------
    def admit(self, seq: Sequence, hits: list[int]) -> None:
        """Map seq onto its prefix-cache hits (the caller then appends blocks for the rest)."""
        assert not seq.block_ids and seq.num_computed_tokens == 0
        for block in hits:
            self._take(block)
            seq.block_ids.append(block)
            block_hash = self.block_hash[block]
            assert block_hash is not None  # a hit is found through its hash
            seq.block_hashes.append(block_hash)
        seq.num_computed_tokens = len(hits) * self.block_size

    def try_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Give seq enough blocks to hold `num_new_tokens` more tokens, if enough are free (True);
        else change nothing (False)."""
        needed = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size) - len(seq.block_ids)
        if needed <= 0:  # most decode steps: the last block has room
            return True
        if needed > len(self.free_queue):
            return False
        for _ in range(needed):
            block, _ = self.free_queue.popitem(last=False)
            self._forget_hash(block)
            self._take(block)
            seq.block_ids.append(block)
        return True

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        """Give seq enough blocks to hold `num_new_tokens` more tokens (the caller checked they are free)."""
        if not self.try_append(seq, num_new_tokens):
            raise RuntimeError(f"BlockManager.append: not enough free blocks for {num_new_tokens} more tokens")

    def commit_full_blocks(self, seq: Sequence) -> None:
        """Hash the blocks that became full and computed, so later requests can reuse them. A block
        counts once its KV is launched (a reader runs after it on the device) and its tokens are
        known (not placeholders for tokens still being sampled)."""
        if not self.enable_prefix_caching or seq.num_computed_tokens // self.block_size <= len(seq.block_hashes):
            return  # most steps: no block became full
        num_full = min(seq.num_computed_tokens, len(seq) - seq.num_pending_tokens) // self.block_size
        for i in range(len(seq.block_hashes), num_full):
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            h = hash_block(parent, seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
            seq.block_hashes.append(h)
            block = seq.block_ids[i]
            # A concurrent request may have computed the same content first; keep that one.
            if h not in self.hash_to_block and self.block_hash[block] is None:
                self.block_hash[block] = h
                self.hash_to_block[h] = block

    def release_tail(self, seq: Sequence) -> None:
        """Free the blocks past seq's computed tokens (they held only rejected draft positions)."""
        keep = self.blocks_needed(seq.num_computed_tokens)
        if len(seq.block_ids) > keep:
            seq.block_epoch += 1
        while len(seq.block_ids) > keep:
            self._release(seq.block_ids.pop())

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks; the tail goes first so it is evicted before the shared head."""
        for block in reversed(seq.block_ids):
            self._release(block)
        seq.block_ids.clear()
        seq.block_epoch += 1
        seq.block_hashes.clear()
        seq.num_computed_tokens = 0

    def _release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.num_in_use -= 1
            self.free_queue[block] = None

    def _take(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            self.free_queue.pop(block, None)
            self.num_in_use += 1
        self.ref_counts[block] += 1

    def _forget_hash(self, block: int) -> None:
        h = self.block_hash[block]
        if h is not None:
            del self.hash_to_block[h]
            self.block_hash[block] = None

    def check_invariants(self, live: list[Sequence] | None = None) -> None:
        """Raise AssertionError unless free + in use == total (and, given every live sequence,
        each block's reference count equals the number of sequences holding it)."""
        assert self.num_free_blocks + self.num_in_use == self.num_blocks, (
            f"free {self.num_free_blocks} + in use {self.num_in_use} != total {self.num_blocks}")
        assert all((c == 0) == (b in self.free_queue) for b, c in enumerate(self.ref_counts)), \
            "a block is both referenced and free, or neither"
        assert all(self.block_hash[b] == h for h, b in self.hash_to_block.items()), "hash map out of sync"
        if live is not None:
            expected = [0] * self.num_blocks
            for seq in live:
                for block in seq.block_ids:
                    expected[block] += 1
            assert expected == self.ref_counts, "reference counts do not match the live sequences"
