"""What a head is trained to do: its initial weights, its draft vocabulary and its loss.

**Draft vocabulary** (EAGLE-3): the ``draft_vocab_size`` target tokens seen most often in the
target's generated replies, ties and the rest filled by their counts in a code/text corpus
(``data.corpus_text``), sorted by id. Tokens outside it are never drafted.

**EAGLE-3 loss, with training-time test.** Step 0 is what drafting does from real context:
the head at position p reads the target's hidden states of token p and the embedding of
token p + 1 and is scored on token p + 2. Step s (s = 1 .. ``ttt_steps`` - 1) repeats it with
the head's own output of step s - 1 at position p - 1 in place of the target's hidden state,
as the (s + 1)-th draft token is made at serving time, and its attention sees exactly what
it would see then: the real context up to p - s and the head's own positions p - s + 1 .. p
of steps 1 .. s (Li et al., 2025, "training-time test"). Step s's cross-entropy is weighted
0.8^s. Only reply tokens are scored (prompt tokens are not the target's own); a given reply
is scored on the target's own next tokens (``targets``), not the text's.

**Medusa loss.** Head i (0-based) on the target's final hidden state of token p is scored on
token p + 2 + i through the target's LM head restricted to the draft vocabulary (the full
152k-row head would make CPU training several times slower; serving still scores every
token). Heads start as the identity (zero weights), so head 0 first predicts what the LM head
predicts, as in Cai et al., 2024.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specserve.models.decoder import DecoderLM
from specserve.models.eagle3 import Eagle3Head, Eagle3Layer
from specserve.models.medusa import MedusaHeads
from specserve.models.norm_rope import apply_rotary

STEP_WEIGHT = 0.8


def draft_vocabulary(
    size: int, vocab_size: int, primary: Iterable[int], secondary: Iterable[int] = ()
) -> torch.Tensor:
    """The ``size`` most frequent token ids (``primary`` counts first, ``secondary`` counts
    break ties and fill up, then the lowest ids), sorted ``# [size]``."""
    if not 0 < size <= vocab_size:
        raise ValueError(f"draft vocabulary size {size} must be in [1, {vocab_size}]")
    first, second = Counter(primary), Counter(secondary)
    ranked = sorted(
        (t for t in set(first) | set(second) if 0 <= t < vocab_size),
        key=lambda t: (-first[t], -second[t], t),
    )[:size]
    if len(ranked) < size:
        taken = set(ranked)
        ranked += [t for t in range(vocab_size) if t not in taken][: size - len(ranked)]
    return torch.tensor(sorted(ranked), dtype=torch.long)


def init_eagle3(head: Eagle3Head, target: DecoderLM, lm_head: torch.Tensor) -> None:
    """Start the head's LM head and final norm from the target's (``lm_head # [vocab,
    hidden]``) rows for its draft vocabulary (set ``head``'s vocabulary map first); the rest
    keeps PyTorch's init, with ``fc`` scaled to keep the combined hidden state near the
    target's scale."""
    ids = head.target_ids(torch.arange(head.cfg.draft_vocab_size, device=head.d2t.device))
    with torch.no_grad():
        head.lm_head.weight.copy_(lm_head[ids.to(lm_head.device)].float())
        head.norm.weight.copy_(target.model.norm.weight.float())
        head.fc.weight.mul_(1.0 / len(head.cfg.aux_layer_ids))


def init_medusa(heads: MedusaHeads) -> None:
    """Every residual block starts as the identity (zero weights and biases)."""
    with torch.no_grad():
        for p in heads.parameters():
            p.zero_()


@dataclass
class StepScores:
    """Per draft position: tokens scored and argmax hits (accuracy = hits / scored)."""

    scored: list[int]
    hits: list[int]

    @classmethod
    def empty(cls, n: int) -> StepScores:
        return cls([0] * n, [0] * n)

    def add(self, other: StepScores) -> None:
        for i in range(len(self.scored)):
            self.scored[i] += other.scored[i]
            self.hits[i] += other.hits[i]

    def accuracy(self) -> list[float]:
        return [h / s if s else 0.0 for h, s in zip(self.hits, self.scored, strict=True)]

    def expected_accepted(self) -> float:
        """Expected accepted drafts per step if draft i is right with the measured
        probability given the ones before it were (sum of the running products)."""
        total, run = 0.0, 1.0
        for acc in self.accuracy():
            run *= acc
            total += run
        return total


def target_to_draft_map(vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``# [vocab_size]``: the draft id of each target id in the draft vocabulary ``vocab``
    (sorted target ids), -100 (never scored) for the others."""
    out = torch.full((vocab_size,), -100, dtype=torch.long)
    out[vocab] = torch.arange(len(vocab))
    return out


def _labels(
    tokens: torch.Tensor, prompt_len: int, offset: int, n_rows: int, target_to_draft: torch.Tensor
) -> torch.Tensor:
    """Draft-vocabulary label of row p: token p + offset, or -100 (not scored) when it is past
    the end, part of the prompt or outside the draft vocabulary."""
    idx = torch.arange(n_rows, device=tokens.device) + offset
    ok = idx < len(tokens)
    lab = torch.full((n_rows,), -100, dtype=torch.long, device=tokens.device)
    tok = tokens[idx[ok]]
    mapped = target_to_draft[tok]
    mapped[idx[ok] < prompt_len] = -100
    lab[ok] = mapped
    return lab


def eagle3_loss(
    head: Eagle3Head,
    embed: torch.nn.Module,
    tokens: torch.Tensor,
    hidden: torch.Tensor,
    prompt_len: int,
    target_to_draft: torch.Tensor,
    ttt_steps: int,
    targets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, StepScores]:
    """The training-time-test loss of one sequence (see the module docstring).

    Args:
        embed: the target's embedding (frozen).
        tokens: ``# [T]`` prompt + reply.
        hidden: ``# [T - 1, n * target_hidden]`` the target's captured hidden states.
        target_to_draft: ``# [target_vocab]`` draft id of each target id, -100 outside.
        targets: ``# [T]`` the target's own token at each position, scored in place of
            ``tokens`` (a given reply's labels); None: the tokens are the target's.
    """
    cfg = head.cfg
    layer = head.layers[0]
    assert isinstance(layer, Eagle3Layer)
    attn = layer.self_attn
    n = hidden.shape[0]  # rows p = 0 .. T - 2
    dtype = head.fc.weight.dtype
    with torch.no_grad():
        embeds = embed(tokens[1 : n + 1][None]).to(dtype)  # token p + 1, [1, n, H]
    dev = hidden.device
    positions = torch.arange(n, device=dev)[None]
    cos, sin = head.rotary(positions, dtype)
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    e_norm = layer.input_layernorm(embeds)
    labels = _labels(tokens if targets is None else targets, prompt_len, 2, n, target_to_draft)
    nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    hidden_in = head.combine(hidden)[None]
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    p = torch.arange(n, device=dev).view(n, 1)
    j = torch.arange(n, device=dev).view(1, n)
    total = torch.zeros((), device=dev)
    scores = StepScores.empty(ttt_steps)
    for s in range(ttt_steps):
        normed = layer.hidden_norm(hidden_in)
        residual = normed if cfg.norm_before_residual else hidden_in
        x = torch.cat((e_norm, normed), dim=-1)
        q = apply_rotary(attn.q_proj(x).view(1, n, nh, hd), cos, sin)
        keys.append(apply_rotary(attn.k_proj(x).view(1, n, nkv, hd), cos, sin))
        values.append(attn.v_proj(x).view(1, n, nkv, hd))
        blocks = [j <= p - s] + [j == p - s + t for t in range(1, s + 1)]
        mask = torch.cat(blocks, dim=1)  # [n, (s + 1) n]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            torch.cat(keys, dim=1).transpose(1, 2),
            torch.cat(values, dim=1).transpose(1, 2),
            attn_mask=mask,
            enable_gqa=nh != nkv,
        )
        h = residual + attn.o_proj(out.transpose(1, 2).reshape(1, n, nh * hd))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        lab = labels.clone()
        lab[:s] = -100  # rows whose draft would start before position 0
        valid = lab != -100
        if valid.any():  # logits of the scored rows only: the LM head is the largest matmul
            logits = head.lm_head(head.norm(h[0, valid])).float()
            total = total + STEP_WEIGHT**s * F.cross_entropy(logits, lab[valid])
            scores.scored[s] += int(valid.sum())
            scores.hits[s] += int((logits.argmax(-1) == lab[valid]).sum())
        if cfg.norm_output:  # the state fed to the next step (as Eagle3Head.forward)
            h = head.norm(h)
        hidden_in = torch.cat((torch.zeros_like(h[:, :1]), h[:, :-1]), dim=1)
    return total, scores


def medusa_loss(
    heads: MedusaHeads,
    lm_rows: torch.Tensor,
    tokens: torch.Tensor,
    hidden: torch.Tensor,
    prompt_len: int,
    target_to_draft: torch.Tensor,
    targets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, StepScores]:
    """The Medusa loss of one sequence (see the module docstring).

    Args:
        lm_rows: ``# [draft_vocab, hidden]`` the target's LM-head rows of the draft vocabulary.
        hidden: ``# [T - 1, hidden]`` the target's final hidden states.
        targets: as for :func:`eagle3_loss`.
    """
    n, k = hidden.shape[0], heads.cfg.num_heads
    out = heads(hidden.float())  # [n, K, H]
    logits = out @ lm_rows.T  # [n, K, Vd]
    total = torch.zeros((), device=hidden.device)
    scores = StepScores.empty(k)
    for i in range(k):
        lab = _labels(tokens if targets is None else targets, prompt_len, 2 + i, n, target_to_draft)
        valid = lab != -100
        if valid.any():
            total = total + F.cross_entropy(logits[valid, i], lab[valid])
            scores.scored[i] += int(valid.sum())
            scores.hits[i] += int((logits[valid, i].argmax(-1) == lab[valid]).sum())
    return total, scores
