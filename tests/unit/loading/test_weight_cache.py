"""The weight cache's safetensors files: written, memory-mapped, read into given memory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.loading import weight_cache
from specserve.loading.errors import CorruptModelError
from specserve.models.native import huge_pages


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

    read = weight_cache.read_weights(path, empty)
    assert list(read) == list(state) == list(mapped)
    for name, t in state.items():
        assert read[name].dtype == t.dtype and torch.equal(read[name], t), name
        assert torch.equal(mapped[name], t), name
    assert len(calls) == len(state) and calls[3] == ((1024, 600), torch.bfloat16)
    # each tensor its own memory: no view of one buffer holding the file
    ptrs = {read[n].untyped_storage().data_ptr() for n in ("bias", "half", "scalar")}
    assert len(ptrs) == 3


def test_a_truncated_or_foreign_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "model.bf16.safetensors"
    weight_cache.save_weights(path, _state())
    whole = path.read_bytes()
    path.write_bytes(whole[:-100])
    for load in (
        weight_cache.load_weights_mmap,
        lambda p: weight_cache.read_weights(p, torch.empty),
    ):
        with pytest.raises(CorruptModelError, match="runs past the end"):
            load(path)
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(CorruptModelError, match="unreadable safetensors header"):
        weight_cache.read_weights(path, torch.empty)
    path.write_bytes(b"abc")
    with pytest.raises(CorruptModelError, match="not a safetensors file"):
        weight_cache.read_weights(path, torch.empty)
