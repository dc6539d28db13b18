"""keep_first_layers: the truncated model is exactly the smaller model with the same weights."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.models.decoder import DecoderLM
from specserve.models.layer_drop import keep_first_layers
from tests.conftest import make_tiny_model


def test_truncated_equals_smaller_model_with_same_weights(family: str) -> None:
    full = make_tiny_model(family, seed=2, num_layers=3)
    small = DecoderLM(dataclasses.replace(full.cfg, num_layers=1)).eval()
    small.load_state_dict(full.state_dict(), strict=False)
    truncated = keep_first_layers(full, 1)
    assert truncated.cfg.num_layers == 1 and len(truncated.model.layers) == 1
    ids = list(range(3, 15))
    a = truncated.compute_logits(SingleSequenceCache(truncated, 32).forward(ids))
    b = small.compute_logits(SingleSequenceCache(small, 32).forward(ids))
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("n", [0, 4])
def test_out_of_range_is_refused(n: int) -> None:
    with pytest.raises(ValueError, match=r"num_layers must be in \[1, 3\]"):
        keep_first_layers(make_tiny_model("llama", num_layers=3), n)
