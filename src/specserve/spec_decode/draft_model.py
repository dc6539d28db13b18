"""Drafting with a smaller model that shares the target's tokenizer.

The draft model keeps its own KV cache per request, in a *lane*: a contiguous run of cache
slots (slot of position p = lane base + p) inside one cache shared by all lanes, so several
requests run in one padded forward. The lane's bookkeeping is the list of tokens whose K/V
it holds. On each propose the lane is rolled back (a pointer move, nothing is copied) to the
longest common prefix with the request's committed tokens, the missing committed tokens are
caught up in one forward, and then k tokens are drafted one forward at a time. After a fully
accepted draft the catch-up is two tokens (the last draft and the bonus token).

A released lane keeps its keys and values, and a new request takes the free lane whose tokens
share the longest prefix with its own: a prompt that begins as an earlier one (a
conversation's next turn, a shared system prompt or file) runs only its new part through the
draft, as the target's prefix cache spares the target's prefill.

Confidence stop: a request stops drafting after a token whose draft probability (the top
probability of the processed draft distribution) is below ``confidence_threshold``; that
token is still proposed. A draft that is unsure of its own next token is rarely right about
the ones after it, so those forwards, and the verify rows they would add, are saved. The
draft length is a function of the draft's own outputs, so verification stays exact, greedy or
sampled. transformers' assisted generation stops its assistant the same way
(``assistant_confidence_threshold``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specserve.models.cache_tensors import KVCacheTensors
from specserve.models.decoder import AttentionMetadata, DecoderLM
from specserve.models.native import head_screen
from specserve.models.native.env_switch import switched_off
from specserve.sampling.sampler import logits_to_probs
from specserve.spec_decode.proposer import Proposal, ProposeInput

# Embedding tables are often padded past the tokenizer's vocabulary (to a multiple of 64/128
# rows); Qwen2.5 checkpoints, for one, ship 151,936 or 152,064 rows for the same tokenizer.
# A difference up to this many rows is treated as padding.
MAX_VOCAB_PADDING = 512
_PROBE_TEXT = "def add(a, b):\n    return a + b  # Hello, world! 123 ümlaut 日本"


def confident_draft_length(confidences: Sequence[float], k: int, threshold: float) -> int:
    """How many of a draft's tokens the confidence stop lets through when k are asked for,
    given each token's top probability: up to the first below ``threshold``, that one
    included. ``propose`` applies this rule token by token; replays of recorded traces
    (``replay.py``) apply it to a whole recorded draft."""
    for j, c in enumerate(confidences[:k]):
        if c < threshold:
            return j + 1
    return k


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def _kept(held: Sequence[int], tokens: Sequence[int]) -> int:
    """How many of a lane's ``held`` tokens stay valid for ``tokens`` (non-empty): their
    common prefix, but never the last token, which is fed again (its hidden state is not
    kept)."""
    return min(_common_prefix(held, tokens), len(tokens) - 1)


class VocabMismatchError(ValueError):
    """The draft model cannot draft for the target (different tokenizer or vocabulary)."""


def check_vocab_compatible(
    target_vocab_size: int,
    draft_vocab_size: int,
    target_tokenizer: Any = None,
    draft_tokenizer: Any = None,
) -> None:
    """Refuse a draft whose tokens would mean something else to the target.

    Embedding row counts may differ by up to MAX_VOCAB_PADDING (padding rows); tokenizers,
    when given, must agree on the vocabulary size, EOS ids and the encoding of a probe text.
    """
    diff = abs(target_vocab_size - draft_vocab_size)
    if diff > MAX_VOCAB_PADDING:
        raise VocabMismatchError(
            f"draft vocabulary ({draft_vocab_size} rows) differs from the target's "
            f"({target_vocab_size}) by {diff} > {MAX_VOCAB_PADDING}: not the same tokenizer"
        )
    if target_tokenizer is None or draft_tokenizer is None:
        return
    for attr in ("vocab_size", "eos_token_ids"):
        t, d = getattr(target_tokenizer, attr, None), getattr(draft_tokenizer, attr, None)
        if t != d:
            raise VocabMismatchError(f"tokenizers differ in {attr}: target {t!r}, draft {d!r}")
    t_ids = target_tokenizer.encode(_PROBE_TEXT, add_special_tokens=False)
    d_ids = draft_tokenizer.encode(_PROBE_TEXT, add_special_tokens=False)
    if list(t_ids) != list(d_ids):
        raise VocabMismatchError("tokenizers encode the same text differently")


@dataclass
class _Lane:
    index: int
    base_slot: int
    tokens: list[int] = field(default_factory=list)  # positions whose K/V the lane holds


class DraftModelProposer:
    """Proposer backed by a small decoder (see the module docstring).

    Args:
        model: the draft decoder (its dtype/device are used as they are).
        target_vocab_size: rows of the target's logits; draft probabilities are given over
            this vocabulary (extra draft rows are never proposed, missing ones get 0).
        max_num_seqs: lanes, i.e. requests with draft state at the same time.
        max_model_len: longest sequence a lane holds (committed + drafted tokens).
        block_size: cache block size (lanes start on block boundaries after the scratch block).
        confidence_threshold: stop a request's draft after a token drafted with a top
            probability below this (0 drafts every token asked for; see the module docstring).
    """

    def __init__(
        self,
        model: DecoderLM,
        target_vocab_size: int,
        max_num_seqs: int = 4,
        max_model_len: int = 4096,
        block_size: int = 16,
        confidence_threshold: float = 0.0,
    ) -> None:
        check_vocab_compatible(target_vocab_size, model.cfg.vocab_size)
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
        if not 0.0 <= confidence_threshold < 1.0:
            raise ValueError(f"confidence_threshold must be in [0, 1), got {confidence_threshold}")
        self.confidence_threshold = confidence_threshold
        self.model = model
        self.target_vocab_size = target_vocab_size
        self.max_model_len = min(max_model_len, model.cfg.max_position_embeddings)
        blocks_per_lane = -(-self.max_model_len // block_size)
        self.kv: KVCacheTensors = model.make_kv_cache(
            1 + max_num_seqs * blocks_per_lane, block_size
        )
        self._free = [
            _Lane(i, block_size * (1 + i * blocks_per_lane), []) for i in range(max_num_seqs)
        ][::-1]
        self._lanes: dict[str, _Lane] = {}
        # Most committed tokens one lane had to catch up in the latest propose call (see
        # CATCH_UP_STEADY in proposer.py).
        self.last_catch_up_tokens = 0
        # Of the latest propose call: draft forwards run (catch-up included), and per input
        # the top probability of each drafted token's distribution.
        self.last_num_forwards = 0
        self.last_confidences: list[list[float]] = []
        # A greedy draft's LM head screened in two-bit codes (None: the full head).
        self.head_screen = (
            head_screen.for_head(model.lm_head) if model.device.type == "cpu" else None
        )

    def release(self, request_id: str) -> None:
        """Free the request's lane. Its cached keys and values stay (until another request
        overwrites them): a later request whose tokens begin the same way takes the lane and
        runs only the rest (:meth:`_lane`), the draft's counterpart of the target's prefix
        cache."""
        lane = self._lanes.pop(request_id, None)
        if lane is not None:
            self._free.append(lane)

    def _lane(self, request_id: str, token_ids: Sequence[int] = ()) -> _Lane:
        """The request's lane; a new request takes the free lane whose held tokens share the
        longest prefix with ``token_ids``, the least recently freed among equals (whose held
        tokens are the least likely to be asked for again)."""
        lane = self._lanes.get(request_id)
        if lane is None:
            if not self._free:
                raise RuntimeError(
                    f"draft model has no free lane for request {request_id!r}: all "
                    f"{len(self._lanes)} are in use (raise max_num_seqs or release requests)"
                )
            lane = self._lanes[request_id] = self._free.pop(self._best_free(token_ids))
        return lane

    def _best_free(self, token_ids: Sequence[int]) -> int:
        """Index in ``_free`` of the lane a new request with ``token_ids`` takes (non-empty
        ``_free``): the longest shared prefix, the least recently freed among equals."""
        shared = [_common_prefix(free.tokens, token_ids) for free in self._free]
        return max(range(len(shared)), key=lambda j: (shared[j], -j))

    def uncached_tokens(self, request_id: str, prompt_ids: Sequence[int]) -> int:
        """Tokens :meth:`prefill` would run for this prompt now: all but the prefix held by
        the request's lane, or by the free lane a new request would take (0 for a prompt the
        draft cannot hold)."""
        if not prompt_ids or len(prompt_ids) > self.max_model_len:
            return 0
        lane = self._lanes.get(request_id)
        if lane is None:
            if not self._free:
                return len(prompt_ids)
            lane = self._free[self._best_free(prompt_ids)]
        return len(prompt_ids) - _kept(lane.tokens, prompt_ids)

    @torch.inference_mode()
    def prefill(self, request_id: str, prompt_ids: list[int], max_tokens: int | None = None) -> int:
        """Run the prompt (or a request's committed tokens) through the draft ahead of the
        first propose (e.g. while the target prefills), so the first decode step only catches
        up one token. Of a prompt that begins as the tokens a free lane holds (an earlier
        request's), only the rest runs; with ``max_tokens``, only that many of the rest (a
        chunk: the next call goes on where this one stopped). Returns how many tokens are
        left to run (0: the lane holds them all)."""
        if not prompt_ids or len(prompt_ids) > self.max_model_len:
            return 0
        lane = self._lane(request_id, prompt_ids)
        keep = _kept(lane.tokens, prompt_ids)
        end = len(prompt_ids) if max_tokens is None else min(len(prompt_ids), keep + max_tokens)
        del lane.tokens[keep:]
        if end > keep:
            self._forward({0: lane}, {0: list(prompt_ids[keep:end])})
        return len(prompt_ids) - end

    @torch.inference_mode()
    def propose(self, batch: Sequence[ProposeInput]) -> list[Proposal]:
        drafts: list[list[int]] = [[] for _ in batch]
        probs: list[list[torch.Tensor]] = [[] for _ in batch]
        # Room in the lane: the k - 1 drafts fed back need positions n .. n + k - 2.
        ks = [
            min(inp.num_draft_tokens, self.max_model_len - len(inp.token_ids) + 1) for inp in batch
        ]
        active = [i for i, k in enumerate(ks) if k > 0]
        self.last_catch_up_tokens = 0
        self.last_num_forwards = 0
        self.last_confidences = [[] for _ in batch]
        if not active:
            return [Proposal([]) for _ in batch]
        lanes = {i: self._lane(batch[i].request_id, batch[i].token_ids) for i in active}

        # Roll each lane back to its common prefix with the committed tokens, then catch up.
        feeds: dict[int, list[int]] = {}
        for i in active:
            lane, tokens = lanes[i], batch[i].token_ids
            keep = _kept(lane.tokens, tokens)
            del lane.tokens[keep:]  # rollback: forget positions >= keep
            feeds[i] = tokens[keep:]
        self.last_catch_up_tokens = max(len(feed) for feed in feeds.values())
        hidden = self._forward(lanes, feeds)
        self._sample(batch, active, hidden, drafts, probs)

        # Draft the remaining tokens, one forward each over the requests that still want more
        # and whose latest draft token was confident enough.
        conf, threshold = self.last_confidences, self.confidence_threshold
        for step in range(1, max(ks[i] for i in active)):
            active = [i for i in active if ks[i] > step and conf[i][-1] >= threshold]
            if not active:
                break
            hidden = self._forward(lanes, {i: [drafts[i][-1]] for i in active})
            self._sample(batch, active, hidden, drafts, probs)

        return [
            Proposal(d, torch.stack(p) if p else None) if d else Proposal([])
            for d, p in zip(drafts, probs, strict=True)
        ]

    def _forward(self, lanes: dict[int, _Lane], feeds: dict[int, list[int]]) -> torch.Tensor:
        """Append ``feeds[i]`` to lane i, all in one padded forward; returns the draft's hidden
        state after each lane's last new token, ``# [len(feeds), hidden]``."""
        order = list(feeds)
        device = self.model.device
        num_new = [len(feeds[i]) for i in order]
        starts = [len(lanes[i].tokens) for i in order]
        t_max = max(num_new)
        s_max = max(s + n for s, n in zip(starts, num_new, strict=True))
        scratch = KVCacheTensors.SCRATCH_BLOCK * self.kv.block_size
        ids = torch.zeros(len(order), t_max, dtype=torch.long)  # [B, T]
        positions = torch.zeros(len(order), t_max, dtype=torch.long)  # [B, T]
        slots = torch.full((len(order), t_max), scratch, dtype=torch.long)  # [B, T]
        context = torch.full((len(order), s_max), scratch, dtype=torch.long)  # [B, S]
        for row, i in enumerate(order):
            lane, start, n = lanes[i], starts[row], num_new[row]
            ids[row, :n] = torch.tensor(feeds[i])
            positions[row, :n] = torch.arange(start, start + n)
            slots[row, :n] = positions[row, :n] + lane.base_slot
            context[row, : start + n] = torch.arange(start + n) + lane.base_slot
            lane.tokens.extend(feeds[i])
        meta = AttentionMetadata(positions.to(device), slots.to(device), context.to(device))
        hidden = self.model(ids.to(device), meta, self.kv)  # [B, T, hidden]
        self.last_num_forwards += 1
        last = torch.tensor(num_new, device=device) - 1
        return hidden[torch.arange(len(order), device=device), last]

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """``# [B, draft_vocab]`` -> ``# [B, target_vocab]``: padding rows are cut off or
        added with -inf, so the draft never proposes a token the target cannot score."""
        v = self.target_vocab_size
        if logits.shape[-1] >= v:
            return logits[:, :v]
        pad = logits.new_full((logits.shape[0], v - logits.shape[-1]), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def _sample(
        self,
        batch: Sequence[ProposeInput],
        active: list[int],
        hidden: torch.Tensor,
        drafts: list[list[int]],
        probs: list[list[torch.Tensor]],
    ) -> None:
        """Append one draft token per active request (``hidden # [len(active), hidden]``, the
        draft's last hidden states) and its distribution's top probability to
        ``last_confidences``."""
        greedy_rows = [r for r, i in enumerate(active) if batch[i].params.greedy]
        if greedy_rows:
            best, conf = self._greedy(hidden[greedy_rows])
            for r, tok, c in zip(greedy_rows, best, conf, strict=True):
                drafts[active[r]].append(tok)
                self.last_confidences[active[r]].append(c)
        sampled = [r for r, i in enumerate(active) if not batch[i].params.greedy]
        if not sampled:
            return
        logits = self._logits(hidden[sampled])
        for j, r in enumerate(sampled):
            i, params = active[r], batch[active[r]].params
            row = logits_to_probs(logits[j : j + 1], params)[0]  # [vocab]
            drafts[i].append(int(torch.multinomial(row, 1, generator=batch[i].generator)[0]))
            probs[i].append(row)
            self.last_confidences[i].append(float(row.max()))

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The draft logits of ``hidden # [B, hidden]``, ``# [B, target_vocab_size]``."""
        return self._to_target_vocab(self.model.compute_logits(hidden))

    def _greedy(self, hidden: torch.Tensor) -> tuple[list[int], list[float]]:
        """Per row of ``hidden # [G, hidden]``: the draft's top token and its probability, from
        the screened head where the draft has one (``models/native/head_screen.py``)."""
        if self.head_screen is not None and not switched_off(head_screen.SWITCH):
            screened = head_screen.greedy(hidden, self.head_screen, self.target_vocab_size)
            if screened is not None:
                return screened
        logits = self._logits(hidden).float()  # [G, vocab]
        top, best = logits.max(-1)
        # top probability = 1 / sum(exp(logit - max logit))
        conf = torch.exp(logits - top[:, None]).sum(-1).reciprocal()
        return best.tolist(), conf.tolist()
