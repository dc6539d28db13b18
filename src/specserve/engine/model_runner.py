"""Model runner: turns scheduled rows into padded tensors, runs the target, returns logits.

No policy lives here: the scheduler decided who runs and the engine what to sample. The
decoder takes a padded batch (``# [B, T]`` tokens, ``# [B, S]`` context slots), so mixing one
long prefill chunk with many 1..k+1-token decode rows would pad every decode row to the chunk's
length. The runner therefore branches once, at the top: decode/verify rows (every token needs
logits) run in one forward, prefill rows in another.

Decode/verify rows of different lengths (requests that drafted different k) would still pad
each to the longest, and on the native layer path (``DecoderLM.fused_layers``, a CPU) a padded
token costs what a real one does: one request verifying 6 tokens beside three plain ones ran
as 24 tokens, not 9, where several-token forwards are compute bound (a CPU's verify, nearly
linear in the tokens at batch 4). There the runner gives each token of such rows a row of
its own instead (*ragged* rows): a one-token row at the token's position, attending to the
request's cache up to that position, whose keys and values the same forward writes before
any row attends (as a multi-token row's later tokens see its earlier ones). A token's bits do
not depend on its row's grouping on that path (``fused_layer.py``: rows batch invariant, the
attention's grouping free), so the output is unchanged; only padding goes. The eager path
keeps the padded form: it gathers each row's context into a tensor of its own, which rows per
token would multiply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specserve.models.cache_tensors import KVCacheTensors
from specserve.models.decoder import AttentionMetadata, DecoderLM


@dataclass
class ForwardRow:
    """One request's tokens in a forward.

    Attributes:
        token_ids: tokens run, in order: committed tokens (prefill chunk or the last sampled
            token), then draft tokens.
        start: absolute position of ``token_ids[0]``; positions ``0..start - 1`` are cached.
        block_table: the request's KV blocks, covering positions ``0..start + T - 1``.
        num_logit_rows: how many trailing tokens need logits (0: a prefill chunk that does
            not reach the end of the committed tokens).
        prompt_logits: a prefill chunk that returns the logits of its prompt tokens too
            (prompt logprobs); it runs with the prefill rows although every token has logits.
    """

    token_ids: list[int]
    start: int
    block_table: list[int]
    num_logit_rows: int
    prompt_logits: bool = False

    def __post_init__(self) -> None:
        assert self.token_ids, "a row runs at least one token"
        assert 0 <= self.num_logit_rows <= len(self.token_ids)


class ModelRunner:
    """Runs one model over a KV cache of its own.

    Attributes:
        model: the decoder.
        kv: its cache tensors.
        block_size: tokens per block (must match the block pool).
    """

    def __init__(self, model: DecoderLM, kv: KVCacheTensors) -> None:
        self.model = model
        self.kv = kv
        self.block_size = kv.block_size
        self.device = model.device
        # With ``model.capture_layers`` set (a proposer that drafts from the target's hidden
        # states): after execute, the captured hidden states of every token of each row, in
        # row order, ``# [len(token_ids), num_captured * hidden]`` each.
        self.last_hidden: list[torch.Tensor] = []
        # Token rows the last execute ran through the model, padding included: what its time
        # depends on (the k controller's step size).
        self.last_num_tokens = 0
        # Ragged decode rows where they apply (module docstring); False pads them (a
        # comparison's other arm: benchmarks/ragged_rows.py).
        self.ragged_rows = True

    def _metadata(self, rows: Sequence[ForwardRow]) -> tuple[torch.Tensor, AttentionMetadata]:
        """Padded ``input_ids # [B, T]`` and metadata; padding goes to scratch slot 0."""
        bs = self.block_size
        b = len(rows)
        t = max(len(r.token_ids) for r in rows)
        s = max(r.start + len(r.token_ids) for r in rows)
        ids = torch.zeros((b, t), dtype=torch.long)
        positions = torch.zeros((b, t), dtype=torch.long)
        context_slots = torch.zeros((b, s), dtype=torch.long)  # scratch slot 0 = padding
        slot_mapping = torch.zeros((b, t), dtype=torch.long)
        for i, r in enumerate(rows):
            n, end = len(r.token_ids), r.start + len(r.token_ids)
            ids[i, :n] = torch.tensor(r.token_ids)
            pos = torch.arange(end)
            table = torch.tensor(r.block_table[: (end + bs - 1) // bs], dtype=torch.long)
            slots = table[pos // bs] * bs + pos % bs  # [end]
            context_slots[i, :end] = slots
            positions[i, :n] = pos[r.start :]
            slot_mapping[i, :n] = slots[r.start :]
        dev = self.device
        meta = AttentionMetadata(
            positions=positions.to(dev, non_blocking=True),
            slot_mapping=slot_mapping.to(dev, non_blocking=True),
            context_slots=context_slots.to(dev, non_blocking=True),
        )
        return ids.to(dev, non_blocking=True), meta

    def _ragged(self, rows: Sequence[ForwardRow]) -> bool:
        """Whether decode/verify ``rows`` run as one-token rows (module docstring): on the
        native layer path, where their lengths differ."""
        lengths = {len(r.token_ids) for r in rows}
        return self.ragged_rows and self.model.fused_layers and len(lengths) > 1

    def _forward_ragged(
        self, rows: Sequence[ForwardRow]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """:meth:`_forward` of decode/verify rows, each token as a one-token row."""
        singles = [
            ForwardRow([tok], r.start + j, r.block_table, 1)
            for r in rows
            for j, tok in enumerate(r.token_ids)
        ]
        logits, captured = self._forward(singles)
        sizes = [len(r.token_ids) for r in rows]
        per_row = list(torch.cat(logits).split(sizes))
        return per_row, list(torch.cat(captured).split(sizes)) if captured else []

    def _forward(self, rows: Sequence[ForwardRow]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Run one padded forward; the logits ``# [num_logit_rows_i, V]`` of each row, and its
        captured hidden states (see :attr:`last_hidden`; empty without capture)."""
        ids, meta = self._metadata(rows)
        self.last_num_tokens += ids.numel()
        captured: list[torch.Tensor] = []
        if self.model.capture_layers:
            hidden, aux = self.model.forward_with_hidden(ids, meta, self.kv)
            captured = [aux[i, : len(r.token_ids)] for i, r in enumerate(rows)]
        else:
            hidden = self.model(ids, meta, self.kv)  # [B, T, hidden]
        t = ids.shape[1]
        flat_index = [
            i * t + j
            for i, r in enumerate(rows)
            for j in range(len(r.token_ids) - r.num_logit_rows, len(r.token_ids))
        ]
        if not flat_index:
            return [hidden.new_empty((0, self.model.cfg.vocab_size)) for _ in rows], captured
        index = torch.tensor(flat_index, device=self.device)
        logits = self.model.compute_logits(hidden.flatten(0, 1).index_select(0, index))
        return list(logits.split([r.num_logit_rows for r in rows])), captured

    @torch.inference_mode()
    def execute(self, rows: Sequence[ForwardRow]) -> torch.Tensor:
        """Run every row, writing their K/V, and return logits ``# [sum num_logit_rows, V]``
        (fp32) in row order: for each row, its last ``num_logit_rows`` tokens."""
        assert rows
        is_decode = [r.num_logit_rows == len(r.token_ids) and not r.prompt_logits for r in rows]
        decode_idx = [i for i, d in enumerate(is_decode) if d]
        prefill_idx = [i for i, d in enumerate(is_decode) if not d]
        per_row: list[torch.Tensor | None] = [None] * len(rows)
        hidden_rows: list[torch.Tensor | None] = [None] * len(rows)
        self.last_num_tokens = 0
        for group in (decode_idx, prefill_idx):
            if group:
                part = [rows[i] for i in group]
                ragged = group is decode_idx and self._ragged(part)
                logits, captured = (self._forward_ragged if ragged else self._forward)(part)
                for i, lg in zip(group, logits, strict=True):
                    per_row[i] = lg
                for i, h in zip(group, captured, strict=False):
                    hidden_rows[i] = h
        self.last_hidden = [h for h in hidden_rows if h is not None]
        parts = [lg for lg in per_row if lg is not None]
        return torch.cat(parts) if len(parts) > 1 else parts[0]
