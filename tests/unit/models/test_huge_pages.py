"""Huge-page-backed weight tensors: shapes, slab sharing, the fallbacks, the env switch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.models.native import huge_pages

MIB = 1 << 20


@pytest.fixture
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huge_pages, "_state", {})


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@pytest.mark.skipif(not huge_pages.available(), reason="no transparent huge pages here")
def test_large_tensors_share_an_advised_slab(fresh_state: None) -> None:
    a = huge_pages.empty((3, MIB), torch.uint8)
    b = huge_pages.empty((MIB // 2, 2), torch.float16)
    assert a.shape == (3, MIB) and a.dtype == torch.uint8 and a.is_contiguous()
    assert b.shape == (MIB // 2, 2) and b.dtype == torch.float16 and b.is_contiguous()
    assert _storage(a) == _storage(b)  # cut from the same slab
    assert a.data_ptr() % huge_pages.HUGE_PAGE == 0  # the slab's first tensor: page aligned
    assert b.data_ptr() % 64 == 0 and b.data_ptr() >= a.data_ptr() + a.numel()
    a.fill_(7)
    b.fill_(1.5)
    assert bool((a == 7).all()) and bool((b == 1.5).all())  # no overlap
    big = huge_pages.empty((huge_pages.SLAB_BYTES,), torch.uint8)
    assert _storage(big) != _storage(a)  # over half a slab: a slab of its own
    # 3 + 2 + 31 MiB fit in the 64 MiB slab; another 31 MiB start the next one.
    rest = huge_pages.empty((huge_pages.SLAB_BYTES // 2 - MIB,), torch.uint8)
    assert _storage(rest) == _storage(a)
    nxt = huge_pages.empty((huge_pages.SLAB_BYTES // 2 - MIB,), torch.uint8)
    assert _storage(nxt) != _storage(a)


def test_small_tensors_are_ordinary(fresh_state: None) -> None:
    t = huge_pages.empty((16, 16), torch.float32)
    assert t.shape == (16, 16) and t.untyped_storage().nbytes() == 16 * 16 * 4


def test_env_switch_and_thp_off_fall_back(
    fresh_state: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPECSERVE_HUGE_PAGES", "0")
    assert not huge_pages.available()
    t = huge_pages.empty((4, MIB), torch.uint8)
    assert t.untyped_storage().nbytes() == 4 * MIB
    monkeypatch.delenv("SPECSERVE_HUGE_PAGES")
    mode = tmp_path / "enabled"
    mode.write_text("always madvise [never]\n")
    monkeypatch.setattr(huge_pages, "_THP_MODE", mode)
    assert not huge_pages.available()
    assert huge_pages.empty((4, MIB), torch.uint8).untyped_storage().nbytes() == 4 * MIB
    monkeypatch.setattr(huge_pages, "_state", {})
    monkeypatch.setattr(huge_pages, "_THP_MODE", tmp_path / "missing")
    assert not huge_pages.available()


def test_resident_huge_bytes_reads_smaps_rollup() -> None:
    got = huge_pages.resident_huge_bytes()
    rollup = Path("/proc/self/smaps_rollup")
    if not rollup.exists():
        assert got is None
        return
    assert isinstance(got, int) and got >= 0 and got % 1024 == 0
    assert "AnonHugePages:" in rollup.read_text()


@pytest.mark.skipif(not huge_pages.available(), reason="no transparent huge pages here")
def test_adopt_moves_a_parameter_in_place(fresh_state: None) -> None:
    """The parameter object stays (a module sharing it sees the move), its values are copied
    exactly into a slab, and a second call, a small tensor or a non-contiguous one stay."""
    torch.manual_seed(0)
    embed = torch.nn.Embedding(1024, 512).to(torch.bfloat16)
    head = torch.nn.Linear(512, 1024, bias=False).to(torch.bfloat16)
    head.weight = embed.weight  # tied, as in Qwen2.5's small models
    before = embed.weight.detach().clone()
    old_ptr = embed.weight.data_ptr()
    assert huge_pages.adopt(head.weight)
    assert head.weight is embed.weight and embed.weight.data_ptr() != old_ptr
    assert torch.equal(embed.weight.detach(), before)
    slab = huge_pages.SLAB_BYTES + 2 * huge_pages.HUGE_PAGE
    assert embed.weight.untyped_storage().nbytes() == slab
    assert not huge_pages.adopt(embed.weight)  # once only
    small = torch.nn.Parameter(torch.ones(16, 16))
    strided = torch.nn.Parameter(torch.ones(2048, 1024).t())
    assert huge_pages.adopt_all([small, strided, head.weight]) == 0
    assert small.data_ptr() != 0 and not strided.is_contiguous()
    fresh = torch.nn.Parameter(torch.ones(1024, 1024))
    assert huge_pages.adopt_all([small, fresh]) == 4 * MIB
    there = torch.nn.Parameter(huge_pages.empty((1024, 1024), torch.float32))
    assert not huge_pages.adopt(there)  # read into huge pages already (weight_cache)


def test_adopt_leaves_everything_where_huge_pages_are_off(
    fresh_state: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECSERVE_HUGE_PAGES", "0")
    p = torch.nn.Parameter(torch.ones(1024, 1024))
    ptr = p.data_ptr()
    assert not huge_pages.adopt(p) and huge_pages.adopt_all([p]) == 0 and p.data_ptr() == ptr
