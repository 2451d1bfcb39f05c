"""Block manager: allocation, prefix-cache hits by chained hashes, LRU reuse, the invariant."""

from __future__ import annotations

import pytest

from server.engine.kv_cache import BlockManager
from server.engine.messages import SamplingParams
from server.engine.sequence import Sequence

BS = 4


def seq(tokens, rid="r"):
    return Sequence(rid, list(tokens), SamplingParams(max_tokens=4), 0.0)


def run_prefill(bm: BlockManager, s: Sequence) -> None:
    hits = bm.prefix_hit(s)
    bm.admit(s, hits)
    n = len(s) - s.num_computed_tokens
    assert bm.try_append(s, n)
    s.num_computed_tokens += n
    bm.commit_full_blocks(s)


def test_allocate_and_free_keep_invariant():
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    a, b = seq(range(10), "a"), seq(range(100, 105), "b")
    run_prefill(bm, a)
    run_prefill(bm, b)
    assert len(a.block_ids) == 3 and len(b.block_ids) == 2 and bm.num_in_use == 5
    bm.check_invariants([a, b])
    bm.free(a)
    bm.check_invariants([b])
    bm.free(b)
    bm.check_invariants([])
    assert bm.num_free_blocks == 8 and bm.usage == 0.0


def test_prefix_hit_shares_full_blocks_and_leaves_one_token():
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a = seq(range(12), "a")
    run_prefill(bm, a)
    # Identical prompt: only 2 of 3 full blocks may hit, the last token must be computed.
    b = seq(range(12), "b")
    hits = bm.prefix_hit(b)
    assert hits == a.block_ids[:2]
    # Longer prompt sharing 3 blocks then diverging.
    c = seq(list(range(12)) + [99, 98], "c")
    assert bm.prefix_hit(c) == a.block_ids
    # Same tokens in block 2 but a different block 1: chained hash must miss after block 1.
    d = seq([0, 1, 2, 3, 7, 7, 7, 7, 8, 9, 10, 11, 5], "d")
    assert bm.prefix_hit(d) == a.block_ids[:1]
    run_prefill(bm, c)
    assert c.block_ids[:3] == a.block_ids and c.num_computed_tokens == 14
    assert [bm.ref_counts[x] for x in a.block_ids] == [2, 2, 2]
    bm.check_invariants([a, c])
    bm.free(a)
    bm.free(c)
    bm.check_invariants([])


def test_freed_cached_blocks_hit_then_evict_lru():
    bm = BlockManager(4, BS, enable_prefix_caching=True)
    a = seq(range(9), "a")  # 3 blocks, 2 full
    run_prefill(bm, a)
    full = a.block_ids[:2]
    bm.free(a)
    again = seq(range(9), "again")
    assert bm.prefix_hit(again) == full  # still cached although free
    # Taking all 4 blocks for unrelated tokens evicts the cached ones.
    other = seq(range(500, 516), "o")
    run_prefill(bm, other)
    assert bm.prefix_hit(again) == []
    bm.check_invariants([other])


def test_lru_evicts_least_recently_freed_and_tail_first():
    bm = BlockManager(6, BS, enable_prefix_caching=True)
    a, b = seq(range(9), "a"), seq(range(200, 209), "b")
    run_prefill(bm, a)
    run_prefill(bm, b)
    a_blocks = list(a.block_ids)
    bm.free(a)  # freed first -> evicted first
    bm.free(b)
    newcomer = seq(range(900, 905), "n")  # needs 2 blocks
    run_prefill(bm, newcomer)
    # a's partial tail block and then its second full block went; its first block still hits.
    assert bm.prefix_hit(seq(range(9))) == a_blocks[:1]
    assert len(bm.prefix_hit(seq(range(200, 209)))) == 2
    bm.check_invariants([newcomer])


def test_no_prefix_caching():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    a = seq(range(12), "a")
    run_prefill(bm, a)
    assert bm.prefix_hit(seq(range(12))) == []
    bm.free(a)
    bm.check_invariants([])


def test_can_admit_counts_free_cached_hits():
    bm = BlockManager(3, BS, enable_prefix_caching=True)
    a = seq(range(9), "a")  # uses all 3 blocks
    run_prefill(bm, a)
    bm.free(a)
    b = seq(list(range(8)) + [1, 2, 3, 4, 5], "b")  # hits 2 blocks, needs 2 more: 4 > 3
    hits = bm.prefix_hit(b)
    assert len(hits) == 2
    assert not bm.can_admit(b, hits, len(b) - 8)
    assert bm.can_admit(b, hits, 4)


def test_invariant_detects_corruption():
    bm = BlockManager(4, BS, enable_prefix_caching=True)
    a = seq(range(5))
    run_prefill(bm, a)
    bm.num_in_use += 1
    with pytest.raises(AssertionError, match="free"):
        bm.check_invariants()


def test_try_append_changes_nothing_when_blocks_are_short():
    bm = BlockManager(3, BS, enable_prefix_caching=False)
    a = seq(range(10))
    assert bm.try_append(a, 10) and len(a.block_ids) == 3
    a.num_computed_tokens = 10
    assert bm.try_append(a, 2)  # fits in the last block: no new one
    assert not bm.try_append(a, 3)  # needs a fourth block: nothing changes
    assert len(a.block_ids) == 3 and bm.num_free_blocks == 0
    with pytest.raises(RuntimeError, match="not enough free blocks"):
        bm.append(a, 3)
    bm.check_invariants([a])
