"""One sequence in contiguous cache slots: the batch-1 path used by plain generation,
the reference oracle and tests. Rolling back is moving ``num_tokens`` back; nothing is copied.
"""

from __future__ import annotations

import torch

from specserve.models.arch import ArchConfig
from specserve.models.decoder import AttentionMetadata, DecoderLM


class SingleSequenceCache:
    """KV cache for one sequence of at most ``max_len`` tokens.

    Attributes:
        num_tokens: positions whose K/V are committed (the next token goes at this position).
    """

    def __init__(self, model: DecoderLM, max_len: int, block_size: int = 16) -> None:
        self.model = model
        self.max_len = max_len
        num_blocks = 1 + (max_len + block_size - 1) // block_size  # + scratch block
        self.kv = model.make_kv_cache(num_blocks, block_size)
        # Slot of position p is block_size + p: block 0 is the scratch block.
        self._base = block_size
        self.num_tokens = 0
        self.last_captured: torch.Tensor | None = None

    @property
    def arch(self) -> ArchConfig:
        return self.model.cfg

    def metadata(self, num_new: int) -> AttentionMetadata:
        start, end = self.num_tokens, self.num_tokens + num_new
        if end > self.max_len:
            raise ValueError(f"sequence of {end} tokens exceeds the cache's {self.max_len}")
        device = self.model.device
        positions = torch.arange(start, end, device=device).unsqueeze(0)
        return AttentionMetadata(
            positions=positions,
            slot_mapping=positions + self._base,
            context_slots=torch.arange(end, device=device).unsqueeze(0) + self._base,
        )

    @torch.inference_mode()
    def forward(self, token_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """Append tokens and return their final hidden states ``# [T, hidden]``. With the
        model's ``capture_layers`` set, the captured hidden states of these tokens are left in
        :attr:`last_captured` (``# [T, features]``)."""
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=self.model.device).view(1, -1)
        meta = self.metadata(ids.shape[1])
        if self.model.capture_layers:
            hidden, captured = self.model.forward_with_hidden(ids, meta, self.kv)
            self.last_captured = captured[0]
        else:
            hidden, self.last_captured = self.model(ids, meta, self.kv), None
        self.num_tokens += ids.shape[1]
        return hidden[0]

    def truncate(self, num_tokens: int) -> None:
        """Forget every position >= ``num_tokens`` (KV rollback by bookkeeping)."""
        assert 0 <= num_tokens <= self.num_tokens
        self.num_tokens = num_tokens
