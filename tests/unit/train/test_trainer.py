"""The training loop: a run interrupted (Ctrl-C) and resumed ends where an uninterrupted run
ends; a checkpoint that cannot be written (disk full) leaves the previous one whole and says
so; resuming without a checkpoint, or from one made for other settings, is refused."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

from specserve.train.objectives import StepScores
from specserve.train.trainer import CHECKPOINT, CheckpointError, TrainConfig, train

DATA = [torch.randn(5, 4, generator=torch.Generator().manual_seed(i)) for i in range(12)]


def make_module() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def loss_fn_for(
    module: torch.nn.Module, fail_at: int | None = None, calls: list[int] | None = None
):  # type: ignore[no-untyped-def]
    def loss_fn(i: int) -> tuple[torch.Tensor, StepScores]:
        if calls is not None:
            calls.append(i)
            if fail_at is not None and len(calls) == fail_at:
                raise KeyboardInterrupt
        x = DATA[i]
        loss = ((module(x) - x.sum(-1, keepdim=True)) ** 2).mean()
        return loss, StepScores([5], [int(loss < 1)])

    return loss_fn


CFG = TrainConfig(epochs=2, lr=0.05, batch_tokens=10, warmup_steps=2, checkpoint_every=3)


def run(module: torch.nn.Module, work: Path, resume: bool = False, fail_at: int | None = None):  # type: ignore[no-untyped-def]
    calls: list[int] = []
    return train(
        module, loss_fn_for(module, fail_at, calls), list(range(1, 12)), [0], 1, CFG, work,
        resume=resume, extra={"kind": "test"}, tokens_of=lambda i: 5, progress=lambda _: None,
    )  # fmt: skip


def test_interrupted_and_resumed_equals_uninterrupted(tmp_path: Path) -> None:
    straight = make_module()
    state = run(straight, tmp_path / "a")
    assert state.step == 12 and state.epoch == 2
    assert [p["step"] for p in state.curve] == [3, 6, 9, 12]

    module = make_module()
    with pytest.raises(KeyboardInterrupt):
        run(module, tmp_path / "b", fail_at=10)  # mid-batch in epoch 1
    assert (tmp_path / "b" / CHECKPOINT).is_file()
    resumed = make_module()
    state2 = run(resumed, tmp_path / "b", resume=True)
    assert state2.step == 12
    for p, q in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    work = tmp_path / "w"
    work.mkdir()
    module = make_module()
    real_save = torch.save
    saves: list[int] = []

    def save(obj, path):  # type: ignore[no-untyped-def]
        saves.append(1)
        if len(saves) == 2:  # the second checkpoint hits a full disk half-way
            Path(path).write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(obj, path)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(CheckpointError, match=r"No space left.*previous checkpoint is intact"):
        run(module, work)
    blob = torch.load(work / CHECKPOINT, weights_only=False)
    assert blob["state"]["step"] == 3  # the first checkpoint, whole
    assert not list(work.glob("*.tmp"))


def test_resume_needs_a_matching_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint"):
        run(make_module(), tmp_path, resume=True)
    run(make_module(), tmp_path)
    with pytest.raises(CheckpointError, match="other settings"):
        train(make_module(), loss_fn_for(make_module()), [1, 2], [0], 1, CFG, tmp_path,
              resume=True, extra={"kind": "other"}, tokens_of=lambda i: 5,
              progress=lambda _: None)  # fmt: skip
    (tmp_path / CHECKPOINT).write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="unreadable"):
        run(make_module(), tmp_path, resume=True)
