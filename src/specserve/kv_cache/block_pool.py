"""Block pool: which KV blocks are free, who holds them, and which hold a cached prefix.

Pure Python, no tensors. Terms:

* **block**: ``block_size`` consecutive KV slots; block ``b`` holds slots
  ``b * block_size .. (b + 1) * block_size - 1`` of the model's
  :class:`~specserve.models.cache_tensors.KVCacheTensors`.
  Block 0 is the scratch block and is never handed out.
* **ref count**: how many requests' block tables contain the block. A block with ref count 0
  is *free*: it sits in the free queue and may be handed out again.
* **block hash**: digest of a *full, committed* block's token ids chained with the previous
  block's hash, so equal hashes mean equal whole prefixes. A hashed block stays findable after
  its ref count drops to 0 (prefix caching) until it is evicted, least recently freed first,
  when the free queue hands it out again. Draft tokens never get hashed.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence

BlockHash = bytes


class NoFreeBlocksError(RuntimeError):
    """The pool has fewer free blocks than were asked for (the scheduler should preempt)."""


def hash_block_tokens(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """Hash of one full block: its token ids chained with the hash of the block before it."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or b"root")
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def hash_prefix_blocks(
    token_ids: Sequence[int], block_size: int, parent: BlockHash | None = None
) -> list[BlockHash]:
    """Hash chain of every *full* block of ``token_ids`` (a trailing partial block is skipped)."""
    hashes: list[BlockHash] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


class BlockPool:
    """Free list, ref counts and the prefix-cache index over ``num_blocks`` blocks.

    Attributes:
        num_blocks: total blocks including the scratch block 0.
        enable_prefix_caching: when False, :meth:`cache_block` and lookups are no-ops.
    """

    SCRATCH_BLOCK = 0

    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (scratch + one usable), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hashes: list[BlockHash | None] = [None] * num_blocks
        # Free blocks in eviction order: the first one is handed out next. Unhashed blocks are
        # put at the front (nothing to lose), hashed ones at the back (least recently freed
        # hashed block is evicted first).
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        self._cached: dict[BlockHash, int] = {}
        self.num_cache_hits = 0  # blocks reused through the prefix cache (cumulative)
        self.num_cache_queries = 0  # blocks looked up in the prefix cache (cumulative)

    # --- queries -----------------------------------------------------------------------------

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0, including evictable prefix-cache blocks."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_usable_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks currently findable by hash (in use or free)."""
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by at least one request, 0..1."""
        return self.num_used_blocks / self.num_usable_blocks

    def lookup(self, block_hash: BlockHash) -> int | None:
        """The block holding this prefix hash, or None."""
        if not self.enable_prefix_caching:
            return None
        return self._cached.get(block_hash)

    # --- state changes -----------------------------------------------------------------------

    def allocate(self, num: int) -> list[int]:
        """Hand out ``num`` free blocks (ref count 1 each), evicting cached ones as needed.

        Raises:
            NoFreeBlocksError: fewer than ``num`` blocks are free; nothing is changed.
        """
        if num > len(self._free):
            raise NoFreeBlocksError(f"asked for {num} blocks, {len(self._free)} free")
        blocks = []
        for _ in range(num):
            block, _ = self._free.popitem(last=False)
            self._evict(block)
            assert self.ref_counts[block] == 0
            self.ref_counts[block] = 1
            blocks.append(block)
        return blocks

    def touch(self, blocks: Iterable[int]) -> None:
        """Add one reference to each block (a prefix-cache hit); free ones leave the free queue."""
        for block in blocks:
            assert block != self.SCRATCH_BLOCK
            if self.ref_counts[block] == 0:
                del self._free[block]
            self.ref_counts[block] += 1

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference from each block; blocks reaching 0 join the free queue.

        Pass a request's blocks tail first, so that the tail of a prefix is evicted before
        its head (a head is shared more often).
        """
        for block in blocks:
            assert self.ref_counts[block] > 0, f"double free of block {block}"
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self._free[block] = None
                if self.block_hashes[block] is None:
                    self._free.move_to_end(block, last=False)

    def cache_block(self, block: int, block_hash: BlockHash) -> None:
        """Make a full committed block findable by ``block_hash``.

        If another block already holds the same prefix, the index keeps that one and this
        block simply stays private to its request.
        """
        if not self.enable_prefix_caching:
            return
        assert self.ref_counts[block] > 0, "only held blocks are cached"
        if self.block_hashes[block] is not None or block_hash in self._cached:
            return
        self.block_hashes[block] = block_hash
        self._cached[block_hash] = block

    def record_queries(self, num_queried: int, num_hit: int) -> None:
        self.num_cache_queries += num_queried
        self.num_cache_hits += num_hit

    def _evict(self, block: int) -> None:
        h = self.block_hashes[block]
        if h is not None:
            self.block_hashes[block] = None
            if self._cached.get(h) == block:
                del self._cached[h]

    def check_invariants(self) -> None:
        """Assert the pool's internal consistency (tests and debugging)."""
        assert self.ref_counts[self.SCRATCH_BLOCK] == 0
        assert self.SCRATCH_BLOCK not in self._free
        for b in range(1, self.num_blocks):
            assert (self.ref_counts[b] == 0) == (b in self._free), f"block {b}"
            assert self.ref_counts[b] >= 0
        for h, b in self._cached.items():
            assert self.block_hashes[b] == h
