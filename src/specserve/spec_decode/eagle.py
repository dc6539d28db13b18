"""EAGLE-3 drafting: a one-layer head over the target's own hidden states.

The engine hands the proposer, for each request, the target's captured hidden states of the
committed positions it has not shown before (``ProposeInput.hidden_states``; they come from
the prefill and verify forwards the engine runs anyway). With committed tokens
``x_0 .. x_n`` the target has run positions ``0 .. n - 1``; head position i reads the
target's hidden state of token i and the embedding of token i + 1, so a propose call:

1. rolls the head's K/V back to the committed positions (drafts are dropped; a pointer move),
2. catches up the new committed positions in one head forward (usually the accepted drafts
   and the bonus token's predecessor: 1 .. k + 1 rows),
3. drafts: the last row's logits give draft 1; each further draft feeds the head its own
   output before the final norm and the embedding of the token it just drafted, at the next
   position.

A request whose hidden states start past what the head holds (a prefix-cache hit, a
preemption) starts a fresh head context there: drafts get worse, output stays the target's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specserve.loading.spec_heads import check_eagle3_fits
from specserve.models.decoder import DecoderLM
from specserve.models.eagle3 import Eagle3Head, HeadKV
from specserve.sampling.sampler import logits_to_probs
from specserve.spec_decode.proposer import Proposal, ProposeInput


@dataclass
class _State:
    cache: HeadKV
    committed_end: int  # head positions < this hold committed context
    # The head's logits and output of the last committed position (what draft 1 comes from).
    last_logits: torch.Tensor | None = None
    last_out: torch.Tensor | None = None


class EagleProposer:
    """Drafts with an :class:`Eagle3Head` (see the module docstring).

    Args:
        target: the target decoder (its embedding is the head's; its shapes are checked).
        head: the head, already in the target's dtype and on its device.
        name: how errors name the head (its directory).
    Raises:
        HeadMismatchError: the head was trained for another target shape or vocabulary.
    """

    def __init__(self, target: DecoderLM, head: Eagle3Head, name: str = "") -> None:
        check_eagle3_fits(head.cfg, target.cfg, name)
        self.target = target
        self.head = head
        self.target_hidden_layers: tuple[int, ...] = tuple(head.cfg.aux_layer_ids)
        self._states: dict[str, _State] = {}

    def release(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    @torch.inference_mode()
    def propose(self, batch: Sequence[ProposeInput]) -> list[Proposal]:
        return [self._propose_one(inp) for inp in batch]

    def _embed(self, token_ids: list[int]) -> torch.Tensor:
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.target.device)
        embed = self.head.embed_tokens or self.target.model.embed_tokens
        return embed(ids).to(self.head.fc.weight.dtype)  # [1, T, H]

    def _state_for(self, inp: ProposeInput) -> _State | None:
        """The request's head state, rolled back to its committed context and ready for the
        hidden states in ``inp`` (None: nothing to draft from)."""
        state = self._states.get(inp.request_id)
        start = inp.hidden_start
        if inp.hidden_states is None:
            if (
                state is None
                or state.last_out is None
                or state.committed_end != len(inp.token_ids) - 1
            ):
                return None
        elif state is None or start != state.committed_end:
            state = _State(self.head.new_cache(start), committed_end=start)
            self._states[inp.request_id] = state
        state.cache.truncate(state.committed_end)
        return state

    def _propose_one(self, inp: ProposeInput) -> Proposal:
        state = self._state_for(inp)
        if state is None:
            return Proposal([])
        n = len(inp.token_ids) - 1  # the last committed token, not yet run by the target
        head = self.head
        if inp.hidden_states is not None:
            start, m = inp.hidden_start, len(inp.hidden_states)
            if start + m != n:
                raise ValueError(
                    f"request {inp.request_id!r}: hidden states of positions {start}.."
                    f"{start + m - 1} do not end before the last committed token ({n})"
                )
            hidden = head.combine(inp.hidden_states)[None]  # [1, m, H]
            embeds = self._embed(inp.token_ids[start + 1 : n + 1])
            positions = torch.arange(start, n, device=hidden.device)[None]
            logits, out = head(embeds, hidden, positions, state.cache)
            state.committed_end = n
            state.last_logits, state.last_out = logits[0, -1], out[:, -1:]
        # else: the same committed tokens as last time; redraft from the kept last row
        assert state.last_logits is not None and state.last_out is not None
        state_logits, state_out = state.last_logits, state.last_out
        drafts: list[int] = []
        probs: list[torch.Tensor] = []
        position = n
        for j in range(inp.num_draft_tokens):
            token, row = self._pick(state_logits, inp)
            drafts.append(token)
            if row is not None:
                probs.append(row)
            if j + 1 == inp.num_draft_tokens:
                break
            pos = torch.tensor([[position]], device=state_out.device)
            logits, state_out = head(self._embed([token]), state_out, pos, state.cache)
            state_logits = logits[0, -1]
            position += 1
        return Proposal(drafts, torch.stack(probs) if probs else None)

    def _pick(
        self, draft_logits: torch.Tensor, inp: ProposeInput
    ) -> tuple[int, torch.Tensor | None]:
        """A target token id from the head's ``# [draft_vocab]`` logits: the argmax for a
        greedy request, else a sample from the request's processed distribution over the
        target vocabulary (returned too, for the verifier)."""
        head = self.head
        if inp.params.greedy:
            best = draft_logits.argmax(-1, keepdim=True)
            return int(head.target_ids(best)[0]), None
        full = draft_logits.new_full((self.target.cfg.vocab_size,), float("-inf"))
        full[head.target_ids(torch.arange(len(draft_logits), device=full.device))] = draft_logits
        row = logits_to_probs(full[None], inp.params)[0]
        return int(torch.multinomial(row, 1, generator=inp.generator)[0]), row
