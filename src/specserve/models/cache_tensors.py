"""KV cache storage: one flat slot array per layer, addressed by slot index.

A *slot* holds the key and value of one token in one layer. Slot ``s`` lives in block
``s // block_size`` at offset ``s % block_size``; the block pool (``block_pool.py``) decides
which blocks a request owns, this module only stores tensors. Block 0 is reserved as a scratch
block: padded (not real) tokens of a batch write there, and no request ever owns it.

On CPU the tensors live in an anonymous memory mapping: they read as zeros, and a page takes
memory only once a token's key or value is written into it. A cache sized for the longest
sequences of every lane (a draft model's, for instance) then costs the memory of the tokens
it holds, not of its capacity.
"""

from __future__ import annotations

import math
import mmap

import torch


def zeros_on_demand(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """A zero tensor; on CPU backed by an anonymous private mapping (zero-filled by the
    kernel, each page committed on its first write), elsewhere ``torch.zeros``."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(buf, dtype=dtype).view(shape)  # the tensor keeps buf alive


class KVCacheTensors:
    """Key/value tensors for every layer.

    Attributes:
        k: ``# [num_layers, num_slots, num_kv_heads, head_dim]``
        v: ``# [num_layers, num_slots, num_kv_heads, head_dim]``
    """

    SCRATCH_BLOCK = 0

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        assert num_blocks >= 2, "need the scratch block plus at least one usable block"
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (num_layers, num_blocks * block_size, num_kv_heads, head_dim)
        self.k = zeros_on_demand(shape, dtype, device)
        self.v = zeros_on_demand(shape, dtype, device)
        # Per-layer views, made once: indexing ``self.k[layer]`` costs a dispatched op on
        # every write and read, several per layer of every decode step.
        self._k_layers = list(self.k.unbind(0))
        self._v_layers = list(self.v.unbind(0))

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * elem

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def write(
        self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store new keys/values.

        Args:
            slot_mapping: ``# [N]`` slot of each new token (scratch slots for padding).
            k: ``# [N, num_kv_heads, head_dim]``
            v: ``# [N, num_kv_heads, head_dim]``
        """
        self._k_layers[layer].index_copy_(0, slot_mapping, k)
        self._v_layers[layer].index_copy_(0, slot_mapping, v)

    def gather(self, layer: int, context_slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Read keys/values of the given slots.

        Args:
            context_slots: ``# [B, S]`` slots of context positions 0..S-1 of each sequence.
        Returns:
            keys and values, each ``# [B, S, num_kv_heads, head_dim]``.
        """
        b, s = context_slots.shape
        flat = context_slots.reshape(-1)
        k = self._k_layers[layer].index_select(0, flat).view(b, s, *self.k.shape[2:])
        v = self._v_layers[layer].index_select(0, flat).view(b, s, *self.v.shape[2:])
        return k, v
