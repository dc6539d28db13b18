"""Stage 3 of training a head: the optimisation loop, with checkpoints and resume.

AdamW on the head's parameters (fp32), sequences in a seeded order each epoch, gradients
accumulated until ``batch_tokens`` scored tokens, a linear warm-up and cosine decay of the
learning rate. Every ``checkpoint_every`` optimiser steps (and at the end, and on Ctrl-C) the
state goes to the checkpoint file (written beside it, then renamed over it: a crash or a full
disk mid-write leaves the previous checkpoint whole) together with the held-out accuracy per
draft position at that point, the *training curve*. ``resume=True`` continues from it: the
same order, the same position in the epoch, the same optimiser moments.
"""

from __future__ import annotations

import math
import os
import pickle
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specserve.train.objectives import StepScores

CHECKPOINT = "checkpoint.pt"


class CheckpointError(OSError):
    """A checkpoint could not be written (or read); the message says what survives."""


@dataclass
class TrainConfig:
    """Optimisation settings.

    Attributes:
        epochs: passes over the training sequences.
        lr: peak learning rate.
        batch_tokens: scored tokens per optimiser step (gradients accumulate until then).
        warmup_steps: linear warm-up length.
        weight_decay: AdamW's.
        checkpoint_every: optimiser steps between checkpoints (and curve points).
        seed: the order of sequences.
    """

    epochs: int = 2
    lr: float = 5e-4
    batch_tokens: int = 512
    warmup_steps: int = 10
    weight_decay: float = 0.0
    checkpoint_every: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.lr <= 0 or self.batch_tokens < 1 or self.checkpoint_every < 1:
            raise ValueError(
                "need epochs >= 1, lr > 0, batch_tokens >= 1 and checkpoint_every >= 1"
            )


@dataclass
class TrainState:
    """Where training is (what a checkpoint restores)."""

    step: int = 0
    epoch: int = 0
    index: int = 0  # sequences of the current epoch already used
    tokens_seen: int = 0
    seconds: float = 0.0
    curve: list[dict[str, Any]] = field(default_factory=list)


# (sequence index) -> (loss, scores) of one training sequence.
LossFn = Callable[[int], tuple[torch.Tensor, StepScores]]


def save_checkpoint(
    path: Path, module: torch.nn.Module, opt: torch.optim.Optimizer, state: TrainState,
    extra: dict[str, Any],
) -> None:  # fmt: skip
    """Write the checkpoint atomically (see the module docstring).

    Raises:
        CheckpointError: it could not be written; the previous one is untouched.
    """
    tmp = path.with_name(path.name + ".tmp")
    blob = {"module": module.state_dict(), "optimizer": opt.state_dict(),
            "state": state.__dict__, "extra": extra}  # fmt: skip
    try:
        torch.save(blob, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        had = "the previous checkpoint is intact" if path.exists() else "no checkpoint exists"
        raise CheckpointError(f"could not write checkpoint {path}: {exc}; {had}") from exc


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Raises:
        CheckpointError: missing or unreadable.
    """
    try:
        blob: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"cannot resume: checkpoint {path} is unreadable ({exc})") from exc
    return blob


def _lr(cfg: TrainConfig, step: int, total: int) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def evaluate(loss_fn: LossFn, indices: Sequence[int], n_steps: int) -> StepScores:
    """Held-out accuracy per draft position."""
    scores = StepScores.empty(n_steps)
    with torch.no_grad():
        for i in indices:
            scores.add(loss_fn(i)[1])
    return scores


def train(
    module: torch.nn.Module,
    loss_fn: LossFn,
    train_idx: Sequence[int],
    eval_idx: Sequence[int],
    n_steps: int,
    cfg: TrainConfig,
    work: Path,
    *,
    resume: bool,
    extra: dict[str, Any],
    tokens_of: Callable[[int], int],
    progress: Callable[[str], None] = print,
    checkpoint_name: str = CHECKPOINT,
) -> TrainState:
    """Train ``module`` (see the module docstring); returns the final state.

    ``extra`` is stored in the checkpoint ``work / checkpoint_name`` (the draft vocabulary, the
    config); on resume the stored one must equal it. ``tokens_of(i)``: the scored tokens of
    sequence i.

    Raises:
        CheckpointError: a checkpoint could not be written, or ``resume`` without a usable
            checkpoint, or one made for other settings.
        KeyboardInterrupt: after saving a checkpoint at the last completed step.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    state = TrainState()
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / checkpoint_name
    if resume:
        if not ckpt.is_file():
            raise CheckpointError(f"cannot resume: no checkpoint at {ckpt}")
        blob = load_checkpoint(ckpt)
        if blob["extra"] != extra:
            raise CheckpointError(
                f"cannot resume from {ckpt}: it was made for other settings (method, vocabulary "
                "or head shape); start afresh without --resume or use another work directory"
            )
        module.load_state_dict(blob["module"])
        opt.load_state_dict(blob["optimizer"])
        state = TrainState(**blob["state"])
        progress(f"train: resumed at step {state.step} (epoch {state.epoch + 1}, "
                 f"{state.tokens_seen} tokens seen)")  # fmt: skip
    per_epoch = max(1, sum(tokens_of(i) for i in train_idx) // cfg.batch_tokens)
    total_steps = per_epoch * cfg.epochs

    def checkpoint() -> None:
        scores = evaluate(loss_fn, eval_idx, n_steps)
        point = {"step": state.step, "tokens_seen": state.tokens_seen,
                 "accuracy": [round(a, 4) for a in scores.accuracy()],
                 "expected_accepted": round(scores.expected_accepted(), 3)}  # fmt: skip
        if not state.curve or state.curve[-1]["step"] != state.step:
            state.curve.append(point)
        save_checkpoint(ckpt, module, opt, state, extra)
        progress(
            f"train: step {state.step}/{total_steps}, {state.tokens_seen} tokens, held-out "
            f"accuracy per position {point['accuracy']}, expected accepted "
            f"{point['expected_accepted']}"
        )

    t_start = time.perf_counter() - state.seconds
    acc_tokens, last_saved = 0, state.step
    index_at_step = state.index  # where the last optimiser step left the epoch
    window = StepScores.empty(n_steps)
    try:
        while state.epoch < cfg.epochs:
            order = list(train_idx)
            random.Random(cfg.seed + state.epoch).shuffle(order)
            while state.index < len(order):
                i = order[state.index]
                loss, scores = loss_fn(i)
                if loss.requires_grad:
                    loss.backward()
                window.add(scores)
                acc_tokens += tokens_of(i)
                state.index += 1
                if acc_tokens >= cfg.batch_tokens or state.index == len(order):
                    for group in opt.param_groups:
                        group["lr"] = _lr(cfg, state.step, total_steps)
                    torch.nn.utils.clip_grad_norm_(params, 1.0)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    state.step += 1
                    state.tokens_seen += acc_tokens
                    state.seconds = time.perf_counter() - t_start
                    acc_tokens = 0
                    index_at_step = state.index
                    if state.step % cfg.checkpoint_every == 0:
                        checkpoint()
                        last_saved = state.step
            state.epoch += 1
            state.index = index_at_step = 0
        if last_saved != state.step or not state.curve:
            checkpoint()
    except KeyboardInterrupt:
        opt.zero_grad(set_to_none=True)  # a half-accumulated batch is dropped and redone
        state.index = index_at_step
        state.seconds = time.perf_counter() - t_start
        save_checkpoint(ckpt, module, opt, state, extra)
        progress(f"train: interrupted; checkpoint at step {state.step} saved to {ckpt}")
        raise
    return state
