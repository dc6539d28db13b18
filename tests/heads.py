"""Random-weight EAGLE-3 and Medusa heads shaped for the tiny test targets."""

from __future__ import annotations

import torch

from specserve.models.decoder import DecoderLM
from specserve.models.eagle3 import Eagle3Config, Eagle3Head
from specserve.models.medusa import MedusaConfig, MedusaHeads


def make_eagle_head(
    target: DecoderLM,
    seed: int = 0,
    draft_vocab_size: int | None = None,
    aux_layer_ids: tuple[int, ...] | None = None,
) -> Eagle3Head:
    """An EAGLE-3 head for ``target``; with ``draft_vocab_size`` below the target's, its
    vocabulary is a seeded random subset of the target's ids (so the map is not the
    identity)."""
    cfg = target.cfg
    v = draft_vocab_size or cfg.vocab_size
    head_cfg = Eagle3Config(
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        target_hidden_size=cfg.hidden_size,
        aux_layer_ids=aux_layer_ids or (0, 1, cfg.num_layers),
        target_vocab_size=cfg.vocab_size,
        draft_vocab_size=v,
        rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.rms_norm_eps,
    )
    torch.manual_seed(seed)
    head = Eagle3Head(head_cfg)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    if v < cfg.vocab_size:
        perm = torch.randperm(cfg.vocab_size, generator=torch.Generator().manual_seed(seed))
        head.set_vocab_map(perm[:v].sort().values)
    return head.eval().requires_grad_(False)


def make_medusa_heads(target: DecoderLM, seed: int = 0, num_heads: int = 4) -> MedusaHeads:
    torch.manual_seed(seed)
    heads = MedusaHeads(MedusaConfig(target.cfg.hidden_size, target.cfg.vocab_size, num_heads))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0.0, 0.2)
    return heads.eval().requires_grad_(False)
