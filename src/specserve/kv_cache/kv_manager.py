"""Per-request block tables over a :class:`BlockPool`: allocate, commit, roll back, free.

Terms (per request):

* **committed tokens**: leading tokens (prompt + accepted output) whose K/V in the cache is
  final; the request's ``num_computed_tokens``.
* **reserved slots**: slots held beyond the committed tokens for this step's new tokens and
  the k lookahead slots of its draft tokens. After the step, :meth:`commit` moves the
  committed pointer to what was accepted and releases blocks no longer needed: rejected draft
  tokens are "rolled back" by bookkeeping alone, their K/V is simply overwritten later.

Invariant (checked by :meth:`check_invariants`): a request holds exactly
``ceil((committed + reserved) / block_size)`` blocks, and each block's ref count equals the
number of block tables containing it.
"""

from __future__ import annotations

from collections.abc import Sequence

from specserve.kv_cache.block_pool import BlockHash, BlockPool, hash_block_tokens


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Block tables of every request holding KV blocks.

    Attributes:
        pool: the shared block pool.
        block_size: tokens per block.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        self.block_size = block_size
        self.block_tables: dict[str, list[int]] = {}
        self._num_slots: dict[str, int] = {}  # committed + reserved
        self._num_committed: dict[str, int] = {}
        self._hashes: dict[str, list[BlockHash]] = {}  # hash chain of committed full blocks

    @property
    def max_tokens_capacity(self) -> int:
        """Most tokens one request can ever hold (every usable block)."""
        return self.pool.num_usable_blocks * self.block_size

    def num_blocks_needed(self, num_tokens: int) -> int:
        return _cdiv(num_tokens, self.block_size)

    def find_cached_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], int]:
        """Longest run of leading full blocks of ``token_ids`` found in the prefix cache.

        At least one token is always left uncached, so that the request's next forward still
        produces the logits it samples from. Nothing is reserved: pass the blocks to
        :meth:`allocate_slots` in the same scheduling pass.

        Returns:
            the cached blocks and the number of tokens they cover.
        """
        if not self.pool.enable_prefix_caching:
            return [], 0
        bs = self.block_size
        max_blocks = (len(token_ids) - 1) // bs
        blocks: list[int] = []
        parent: BlockHash | None = None
        for i in range(max_blocks):
            parent = hash_block_tokens(parent, token_ids[i * bs : (i + 1) * bs])
            block = self.pool.lookup(parent)
            if block is None:
                break
            blocks.append(block)
        self.pool.record_queries(max_blocks, len(blocks))
        return blocks, len(blocks) * bs

    def allocate_slots(
        self,
        request_id: str,
        num_committed: int,
        num_slots: int,
        cached_blocks: Sequence[int] = (),
    ) -> bool:
        """Make the request's table cover ``num_slots`` slots (committed + new + lookahead).

        Args:
            request_id: the request.
            num_committed: its committed tokens (including ``cached_blocks``' tokens).
            num_slots: total slots it needs this step.
            cached_blocks: prefix-cache hits to adopt; only for a request holding no blocks.
        Returns:
            False, changing nothing, when the pool lacks free blocks (caller preempts).
        """
        assert num_committed <= num_slots
        table = self.block_tables.get(request_id)
        if cached_blocks:
            assert not table, "prefix-cache hits are adopted only by a request with no blocks"
            assert num_committed >= len(cached_blocks) * self.block_size
        have = len(table or ()) + len(cached_blocks)
        num_new = max(0, self.num_blocks_needed(num_slots) - have)
        # Hits in the free queue must leave it, so they count against the free blocks too.
        num_free_hits = sum(1 for b in cached_blocks if self.pool.ref_counts[b] == 0)
        if num_new + num_free_hits > self.pool.num_free_blocks:
            return False
        if table is None:
            table = self.block_tables[request_id] = []
            self._hashes[request_id] = []
        if cached_blocks:
            self.pool.touch(cached_blocks)
            table.extend(cached_blocks)
            for b in cached_blocks:
                h = self.pool.block_hashes[b]
                assert h is not None
                self._hashes[request_id].append(h)
        table.extend(self.pool.allocate(num_new))
        self._num_committed[request_id] = num_committed
        self._num_slots[request_id] = max(num_slots, len(cached_blocks) * self.block_size)
        return True

    def commit(self, request_id: str, token_ids: Sequence[int], num_committed: int) -> None:
        """Record that the first ``num_committed`` tokens' K/V is final; release the rest.

        Newly completed full blocks are entered in the prefix cache (hash chain over
        ``token_ids``, which must be committed tokens only, never drafts). Blocks beyond what
        ``num_committed`` tokens need (unused lookahead) go back to the pool.
        """
        table = self.block_tables[request_id]
        assert num_committed <= self._num_slots[request_id]
        assert num_committed <= len(token_ids)
        bs = self.block_size
        hashes = self._hashes[request_id]
        for i in range(len(hashes), num_committed // bs):
            parent = hashes[-1] if hashes else None
            h = hash_block_tokens(parent, token_ids[i * bs : (i + 1) * bs])
            hashes.append(h)
            self.pool.cache_block(table[i], h)
        keep = self.num_blocks_needed(num_committed)
        if len(table) > keep:
            self.pool.free(reversed(table[keep:]))
            del table[keep:]
        self._num_committed[request_id] = num_committed
        self._num_slots[request_id] = num_committed

    def free(self, request_id: str) -> None:
        """Release every block of a finished, aborted or preempted request (tail first)."""
        table = self.block_tables.pop(request_id, None)
        if table is None:
            return
        self.pool.free(reversed(table))
        del self._num_slots[request_id], self._num_committed[request_id]
        del self._hashes[request_id]

    def slot(self, request_id: str, position: int) -> int:
        """Cache slot of token ``position`` of the request."""
        block = self.block_tables[request_id][position // self.block_size]
        return block * self.block_size + position % self.block_size

    def num_reserved(self, request_id: str) -> int:
        return self._num_slots[request_id] - self._num_committed[request_id]

    def check_invariants(self) -> None:
        """Assert allocated = committed + reserved per request and ref counts = table counts."""
        self.pool.check_invariants()
        counts = [0] * self.pool.num_blocks
        for rid, table in self.block_tables.items():
            assert len(table) == self.num_blocks_needed(self._num_slots[rid]), rid
            assert self._num_committed[rid] <= self._num_slots[rid]
            assert len(self._hashes[rid]) <= len(table)
            for b in table:
                counts[b] += 1
        assert counts == self.pool.ref_counts, "ref counts differ from block tables"
