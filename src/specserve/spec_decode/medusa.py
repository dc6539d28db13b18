"""Medusa drafting: K heads guess the next K tokens at once from one target hidden state.

With committed tokens ``x_0 .. x_n`` the newest target hidden state is that of position
``n - 1`` (the final normed output whose LM-head row gave ``x_n``). Head i reads it and
scores token ``n + i``; the draft is the chain of each head's pick (top-1 for a greedy
request, a sample from the request's processed distribution otherwise). The heads' outputs
go through the target's own LM head in one call. The proposer keeps only that last hidden
state per request: no draft KV cache, nothing to roll back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specserve.loading.spec_heads import check_medusa_fits
from specserve.models.decoder import DecoderLM
from specserve.models.medusa import MedusaHeads
from specserve.sampling.sampler import logits_to_probs
from specserve.spec_decode.proposer import Proposal, ProposeInput


class MedusaProposer:
    """Drafts with :class:`MedusaHeads` (see the module docstring); at most K tokens a step.

    Raises:
        HeadMismatchError: heads trained for another hidden size or vocabulary.
    """

    def __init__(self, target: DecoderLM, heads: MedusaHeads, name: str = "") -> None:
        check_medusa_fits(heads.cfg, target.cfg, name)
        self.target = target
        self.heads = heads
        self.target_hidden_layers: tuple[int, ...] = (target.cfg.num_layers,)
        self._last: dict[str, tuple[int, torch.Tensor]] = {}  # position, its hidden state

    @property
    def num_heads(self) -> int:
        return self.heads.cfg.num_heads

    def release(self, request_id: str) -> None:
        self._last.pop(request_id, None)

    @torch.inference_mode()
    def propose(self, batch: Sequence[ProposeInput]) -> list[Proposal]:
        rows, ks, where = [], [], []
        proposals = [Proposal([]) for _ in batch]
        for i, inp in enumerate(batch):
            if inp.hidden_states is not None and len(inp.hidden_states):
                last = inp.hidden_start + len(inp.hidden_states) - 1
                self._last[inp.request_id] = (last, inp.hidden_states[-1])
            kept = self._last.get(inp.request_id)
            if kept is None or kept[0] != len(inp.token_ids) - 2:
                continue  # no hidden state of the position before the last token
            rows.append(kept[1])
            ks.append(min(inp.num_draft_tokens, self.num_heads))
            where.append(i)
        if not rows:
            return proposals
        hidden = self.heads(torch.stack(rows), max(ks))  # [B, K, H]
        logits = self.target.compute_logits(hidden.to(self.target.dtype))  # [B, K, V] fp32
        greedy = [j for j, i in enumerate(where) if batch[i].params.greedy]
        best = logits[greedy].argmax(-1).tolist() if greedy else []
        for j, i in enumerate(where):
            inp, k = batch[i], ks[j]
            if inp.params.greedy:
                proposals[i] = Proposal(best[greedy.index(j)][:k])
                continue
            probs = logits_to_probs(logits[j, :k], inp.params)  # [k, V]
            draft = torch.multinomial(probs, 1, generator=inp.generator)[:, 0].tolist()
            proposals[i] = Proposal(draft, probs)
        return proposals
