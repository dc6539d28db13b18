"""The weight cache's safetensors files (written, memory-mapped, read into given memory) and
where a built bf16 model keeps the weights it streams."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.loading import weight_cache
from specserve.loading.errors import CorruptModelError
from specserve.loading.loader import build_model
from specserve.models.native import bf16_native, huge_pages
from tests.conftest import make_tiny_model


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {  # 4-byte elements first: the mapped views need aligned offsets
        "bias": torch.randn(600),
        "scalar": torch.tensor(2.5),
        "none": torch.empty(0, 4),
        "big": torch.randn(1024, 600).to(torch.bfloat16),  # over huge_pages.MIN_BYTES
        "half": torch.randn(3, 5).to(torch.float16),
    }


def test_read_weights_equals_the_mapped_file(tmp_path: Path) -> None:
    path = tmp_path / "model.bf16.safetensors"
    state = _state()
    weight_cache.save_weights(path, state)
    mapped = weight_cache.load_weights_mmap(path)
    calls: list[tuple[tuple[int, ...], torch.dtype]] = []

    def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        calls.append((shape, dtype))
        return huge_pages.empty(shape, dtype)

    read = weight_cache.read_weights(path, empty, lambda n: n != "half")
    assert list(read) == list(state) == list(mapped)
    for name, t in state.items():
        assert read[name].dtype == t.dtype and torch.equal(read[name], t), name
        assert torch.equal(mapped[name], t), name
    assert len(calls) == len(state) - 1 and calls[3] == ((1024, 600), torch.bfloat16)
    # each read tensor its own memory; the one not asked for a view of the mapped file
    ptrs = {read[n].untyped_storage().data_ptr() for n in ("bias", "big", "scalar", "half")}
    assert len(ptrs) == 4
    assert read["half"].untyped_storage().nbytes() == path.stat().st_size


def test_a_truncated_or_foreign_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "model.bf16.safetensors"
    weight_cache.save_weights(path, _state())
    whole = path.read_bytes()
    path.write_bytes(whole[:-100])
    for load in (
        weight_cache.load_weights_mmap,
        lambda p: weight_cache.read_weights(p, torch.empty, lambda n: True),
    ):
        with pytest.raises(CorruptModelError, match="runs past the end"):
            load(path)
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(CorruptModelError, match="unreadable safetensors header"):
        weight_cache.read_weights(path, torch.empty, lambda n: True)
    path.write_bytes(b"abc")
    with pytest.raises(CorruptModelError, match="not a safetensors file"):
        weight_cache.read_weights(path, torch.empty, lambda n: True)


@pytest.mark.skipif(
    not (huge_pages.available() and bf16_native.available()),
    reason="needs transparent huge pages and the native bf16 kernel",
)
def test_a_built_bf16_model_streams_its_weights_from_huge_pages() -> None:
    """build_model moves the projections of 1 MiB or more of a bf16 model on the native path
    into huge pages, in place (the layers' call arguments see them: the logits equal, bit for
    bit, those of the same model built with ``mapped``, a caller about to quantise, which
    leaves every weight where it was)."""
    big = dict(hidden_size=512, intermediate_size=1024, num_heads=8, num_kv_heads=2, head_dim=64)
    tiny = make_tiny_model("qwen2", seed=4, **big).to(torch.bfloat16)
    # the tied head is the embedding (build_model ties them)
    large = {k for k, v in tiny.state_dict().items() if v.numel() * 2 >= huge_pages.MIN_BYTES}
    assert "model.layers.0.mlp.gate_proj.weight" in large  # 1 MiB
    logits = []
    for mapped in (False, True):
        state = {k: v.clone() for k, v in tiny.state_dict().items() if k != "lm_head.weight"}
        ptrs = {k: v.data_ptr() for k, v in state.items()}
        model = build_model(tiny.cfg, state.items(), torch.bfloat16, torch.device("cpu"), mapped)
        assert model.fused_layers
        got = model.state_dict().items()
        moved = {k for k, v in got if k in ptrs and v.data_ptr() != ptrs[k]}
        assert moved == (set() if mapped else {k for k in large if k.endswith("proj.weight")})
        logits.append(model.compute_logits(SingleSequenceCache(model, 16).forward([5, 17, 3])))
    assert torch.equal(logits[0], logits[1])
