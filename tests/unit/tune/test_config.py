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


def test_shipped_heads_example_compares_every_mode_at_one_k_grid() -> None:
    from pathlib import Path

    from specserve.tune.config import load_tune_config

    cfg = load_tune_config(Path(__file__).parents[3] / "examples" / "heads-tune.yaml")
    assert [p.method for p in cfg.proposers] == ["draft", "eagle", "medusa", "ngram", "suffix"]
    eagle = next(p for p in cfg.proposers if p.method == "eagle")
    args = eagle.serve_args(4)
    assert args[:2] == ["--spec-method", "eagle"]
    assert args[-2:] == ["--draft-model", "qwen2.5-coder-1.5b-instruct-eagle"]
    assert max(cfg.k) <= 4  # the Medusa heads draft at most 4 tokens


def test_given_replies_example_compares_two_heads_beside_the_draft_model() -> None:
    from pathlib import Path

    from specserve.tune.config import load_tune_config

    path = Path(__file__).parents[3] / "examples" / "heads-given-replies-tune.yaml"
    cfg = load_tune_config(path)
    assert [p.method for p in cfg.proposers] == ["draft", "eagle", "eagle"]
    assert [p.draft for p in cfg.proposers[1:]] == ["qwen-eagle-a", "qwen-eagle-b"]
    assert "--text-prompts 120" in path.read_text()  # how the second head was trained


def test_head_methods_need_a_head_and_take_no_draft_options() -> None:
    with pytest.raises(ValidationError, match="needs a trained head"):
        ProposerConfig(name="e", method="eagle")
    with pytest.raises(ValidationError, match="draft settings need a draft method"):
        ProposerConfig(name="e", method="medusa", draft="h", draft_weights="int4")
    with pytest.raises(ValidationError, match="takes no draft"):
        ProposerConfig(name="n", method="ngram", draft="h")
