"""Proposer specs of ``specserve tune`` turn into the right `specserve serve` arguments."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from specserve.tune.config import ProposerConfig


def test_draft_settings_become_serve_arguments() -> None:
    spec = ProposerConfig(
        name="d", method="draft", draft="m", draft_num_layers=6, draft_weights="int4"
    )
    args = spec.serve_args(k_max=7)
    assert args[args.index("--num-speculative-tokens") + 1] == "7"
    assert args[args.index("--draft-model") + 1] == "m"
    assert args[args.index("--draft-num-layers") + 1] == "6"
    assert args[args.index("--draft-weights") + 1] == "int4"
    assert "--draft-weights" not in ProposerConfig(name="d", method="draft", draft="m").serve_args(
        3
    )


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"method": "ngram", "draft_weights": "int4"}, "draft settings need a draft method"),
        ({"method": "draft"}, "needs a draft model"),
        ({"method": "draft", "draft": "m", "draft_weights": "int3"}, "draft_weights"),
    ],
)
def test_bad_proposers_are_refused(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        ProposerConfig(name="p", **kwargs)  # type: ignore[arg-type]


def test_shipped_draft_size_example_validates() -> None:
    from pathlib import Path

    from specserve.tune.config import load_tune_config

    cfg = load_tune_config(Path(__file__).parents[3] / "examples" / "draft-size-tune.yaml")
    weights = {p.name: p.draft_weights for p in cfg.proposers}
    assert weights["draft-0.5b-int4"] == "int4" and weights["draft-0.5b-bf16"] is None
    layers = [p for p in cfg.proposers if p.draft_num_layers]
    assert [p.draft_num_layers for p in layers] == [6]
    assert cfg.k == (2, 4)
