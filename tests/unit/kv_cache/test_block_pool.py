"""Block pool and per-request KV manager: ref counts, prefix caching, LRU eviction, no leaks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specserve.kv_cache.block_pool import BlockPool, NoFreeBlocksError, hash_prefix_blocks
from specserve.kv_cache.kv_manager import KVCacheManager


def test_pool_never_hands_out_scratch_and_refuses_overdraw() -> None:
    pool = BlockPool(5)
    blocks = pool.allocate(4)
    assert sorted(blocks) == [1, 2, 3, 4]
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(1)
    pool.free(blocks)
    assert pool.num_free_blocks == 4
    pool.check_invariants()


def test_pool_rejects_too_few_blocks() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(1)


def test_double_free_is_caught() -> None:
    pool = BlockPool(3)
    (b,) = pool.allocate(1)
    pool.free([b])
    with pytest.raises(AssertionError):
        pool.free([b])


def test_hash_chain_depends_on_whole_prefix() -> None:
    a = hash_prefix_blocks([1, 2, 3, 4, 5, 6, 7], 2)
    b = hash_prefix_blocks([9, 2, 3, 4, 5, 6], 2)
    assert len(a) == 3 and len(b) == 3
    assert a[1] != b[1]  # same tokens 3,4 but different first block
    assert hash_prefix_blocks([1, 2, 3, 4], 2) == a[:2]


def test_prefix_hit_shares_blocks_and_refcounts() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4)
    prompt = list(range(10))  # 2 full blocks + 2 tokens
    assert kv.allocate_slots("a", 0, len(prompt))
    kv.commit("a", prompt, len(prompt))
    blocks, n = kv.find_cached_prefix([*prompt, 99])
    assert n == 8 and blocks == kv.block_tables["a"][:2]
    assert kv.allocate_slots("b", n, n + 3, blocks)
    assert kv.block_tables["b"][:2] == blocks
    assert [kv.pool.ref_counts[b] for b in blocks] == [2, 2]
    kv.check_invariants()
    kv.free("a")
    assert [kv.pool.ref_counts[b] for b in blocks] == [1, 1]
    kv.free("b")
    assert kv.pool.num_used_blocks == 0
    # Free but still cached: a third request hits them again.
    blocks2, n2 = kv.find_cached_prefix(prompt)
    assert blocks2 == blocks and n2 == 8
    kv.check_invariants()


def test_lookup_always_leaves_one_token_to_compute() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    prompt = list(range(8))
    assert kv.allocate_slots("a", 0, 8)
    kv.commit("a", prompt, 8)
    _, n = kv.find_cached_prefix(prompt)
    assert n == 4  # the second block is cached too, but its last token must run again


def test_cached_blocks_evicted_lru_only_at_refcount_zero() -> None:
    kv = KVCacheManager(num_blocks=5, block_size=2)  # 4 usable blocks
    for rid, base in (("a", 0), ("b", 100)):
        toks = [base, base + 1, base + 2]
        assert kv.allocate_slots(rid, 0, 3)
        kv.commit(rid, toks, 3)
    kv.free("a")  # a's full block is cached at ref 0, freed first
    kv.free("b")
    assert kv.pool.num_cached_blocks == 2
    # Two unhashed free blocks are handed out before any cached one.
    assert kv.allocate_slots("c", 0, 4)
    assert kv.pool.num_cached_blocks == 2
    # The next allocation must evict, least recently freed first: a's block.
    assert kv.allocate_slots("d", 0, 2)
    assert kv.find_cached_prefix([0, 1, 2])[1] == 0
    assert kv.find_cached_prefix([100, 101, 102])[1] == 2
    # Held blocks are never evicted: the pool is now exhausted instead.
    assert kv.allocate_slots("e", 0, 2)
    assert not kv.allocate_slots("f", 0, 2)
    kv.check_invariants()


def test_lookahead_reserved_then_released_on_commit() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=4)
    assert kv.allocate_slots("a", 0, 6)
    kv.commit("a", list(range(6)), 6)
    assert len(kv.block_tables["a"]) == 2
    # Decode: 1 token + k = 7 lookahead slots -> positions 6..13 need 4 blocks.
    assert kv.allocate_slots("a", 6, 6 + 1 + 7)
    assert len(kv.block_tables["a"]) == 4 and kv.num_reserved("a") == 8
    kv.check_invariants()
    # Two drafts accepted: committed pointer at 9; unused lookahead blocks go back.
    kv.commit("a", list(range(10)), 9)
    assert len(kv.block_tables["a"]) == 3 and kv.num_reserved("a") == 0
    assert kv.pool.num_used_blocks == 3
    kv.check_invariants()


def test_allocation_failure_changes_nothing() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=4)
    assert kv.allocate_slots("a", 0, 8)
    before = (list(kv.pool.ref_counts), kv.pool.num_free_blocks)
    assert not kv.allocate_slots("b", 0, 8)
    assert (list(kv.pool.ref_counts), kv.pool.num_free_blocks) == before
    assert "b" not in kv.block_tables


# --- property-based: random operation sequences never leak ----------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["start", "step", "rollback", "finish", "preempt"]),
        st.integers(0, 5),  # request index
        st.integers(1, 9),  # tokens
        st.integers(0, 7),  # k lookahead / rejected count
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(OPS, st.sampled_from([1, 2, 4]), st.booleans())
def test_random_ops_never_leak(ops: list[tuple[str, int, int, int]], bs: int, prefix: bool) -> None:
    kv = KVCacheManager(num_blocks=24, block_size=bs, enable_prefix_caching=prefix)
    tokens: dict[str, list[int]] = {}  # committed tokens per live request
    computed: dict[str, int] = {}
    for op, idx, n, k in ops:
        rid = f"r{idx}"
        if op == "start" and rid not in tokens:
            prompt = [idx % 3] * n + [idx, n]  # shared prefixes between some requests
            blocks, num_cached = kv.find_cached_prefix(prompt)
            if kv.allocate_slots(rid, num_cached, len(prompt), blocks):
                tokens[rid], computed[rid] = prompt, len(prompt) - 1
                kv.commit(rid, prompt, computed[rid])
        elif op in ("step", "rollback") and rid in tokens:
            # Run the last token + k drafts; accept some of them.
            c = computed[rid]
            if kv.allocate_slots(rid, c, c + 1 + k):
                assert kv.num_reserved(rid) == 1 + k
                kv.check_invariants()
                accepted = 0 if op == "rollback" else min(n - 1, k)
                tokens[rid] += [7] * (accepted + 1)
                computed[rid] = c + 1 + accepted
                kv.commit(rid, tokens[rid], computed[rid])
        elif op in ("finish", "preempt") and rid in tokens:
            kv.free(rid)
            del tokens[rid], computed[rid]
        kv.check_invariants()
        held = {b for t in kv.block_tables.values() for b in t}
        assert kv.pool.num_used_blocks == len(held)
        for r, c in computed.items():
            assert len(kv.block_tables[r]) == kv.num_blocks_needed(c)
    for rid in list(tokens):
        kv.free(rid)
    kv.check_invariants()
    assert kv.pool.num_used_blocks == 0
    assert kv.pool.num_free_blocks == 23
