"""Hidden states recorded by a forward (``capture_layers``) for EAGLE / Medusa: they are the
residual stream entering each named layer (Hugging Face's ``hidden_states`` numbering), the
same on the eager and the fused path, and on the fused path a prompt's rows equal the rows of
its tokens decoded one by one, bit for bit (what training records is what serving sees)."""

from __future__ import annotations

import pytest
import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.models.native import bf16_native
from tests.conftest import make_tiny_model
from tests.fused_reference import eager_twin
from tests.unit.models.test_fused_layer import IDS, _model

native_bf16 = pytest.mark.skipif(
    not bf16_native.available(), reason=f"native bf16 kernel: {bf16_native.unavailable_reason()}"
)


def test_captured_states_are_hugging_face_hidden_states() -> None:
    model = make_tiny_model("qwen2", num_layers=3)
    ids = [4, 8, 15, 16, 23, 42]
    model.capture_layers = (3, 0, 2, 2)  # any order, repeats allowed
    cache = SingleSequenceCache(model, 16)
    with torch.inference_mode():
        final = cache.forward(ids)
        got = cache.last_captured
        assert got is not None and got.shape == (6, 4 * 64)
        embeds = model.model.embed_tokens(torch.tensor(ids))
        # index 0 = embeddings, num_layers = the final normed output
        assert torch.equal(got[:, 64:128], embeds)
        assert torch.equal(got[:, :64], final)
        assert torch.equal(got[:, 128:192], got[:, 192:])
        model.capture_layers = ()
        plain = SingleSequenceCache(model, 16)
        assert torch.equal(plain.forward(ids), final)  # capturing changes nothing
        assert plain.last_captured is None


def test_forward_with_hidden_needs_capture_layers() -> None:
    model = make_tiny_model()
    cache = SingleSequenceCache(model, 8)
    with pytest.raises(ValueError, match="capture_layers"):
        model.forward_with_hidden(torch.tensor([[1, 2]]), cache.metadata(2), cache.kv)


@native_bf16
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_fused_capture_is_chunking_invariant_and_matches_eager(family: str) -> None:
    model = _model(family, "bf16", num_layers=3)
    model.capture_layers = (1, 2, 3)
    prompt = IDS[:18] + IDS  # 40 tokens: chunks of 16, 16 and 8
    with torch.inference_mode():
        whole = SingleSequenceCache(model, 64)
        whole.forward(prompt)
        one = SingleSequenceCache(model, 64)
        rows = []
        for i in prompt:
            one.forward([i])
            assert one.last_captured is not None
            rows.append(one.last_captured)
        assert whole.last_captured is not None
        assert torch.equal(whole.last_captured, torch.cat(rows))
        eager = eager_twin(model)
        twin = SingleSequenceCache(eager, 64)
        twin.forward(prompt)
        assert twin.last_captured is not None
        diff = (twin.last_captured.float() - whole.last_captured.float()).abs().max()
        scale = whole.last_captured.float().abs().max()
        assert float(diff) < 0.05 * float(scale)
