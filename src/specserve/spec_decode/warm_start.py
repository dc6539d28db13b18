"""A k controller given the target's step times before its first request (a warm start).

A fresh :class:`~specserve.spec_decode.k_controller.KController` knows no step cost. It times
each verify size the first time it drafts that many tokens, and it drafts at most twice the
largest size it has timed (``explored_k``: an untimed 9-token verify must not look free on a
CPU), so its first request climbs k = 1, 2, 5 ... and a first rejected draft leaves it plain
until the next probe. In replays of recorded greedy traces with a new controller per prompt
(``benchmarks/k_replay.py --per-prompt --cold``, the gguf pair on an AVX2 host), a cold
controller reached 0.89-0.90x of the best fixed k on ``specserve perf``'s palindrome, cat
and json prompts and 0.76x on fizzbuzz; given the target's forward times over 1 .. 9 tokens
at start, 0.92-1.00x (docs/benchmarks.md). A server's controller is shared by its requests,
so only its first ones start cold; a ``perf`` arm's controller is new for every decode, as
a new server's is, and so is a ``generate`` run's, which keeps the cold start: timing the
steps took 2.4-2.8 s for the gguf 1.5B on that host, more than a short answer loses cold.

:func:`time_verify_steps` times those forwards once, on a scratch cache of the target (a
short prompt of fixed token ids, then each step size on top of it, the best of ``repeats``
timings each, logits of every row included, as a verify computes them), and :func:`seed`
hands them to a controller as its estimates for batch size 1 until a live step of that size
is timed, which replaces the seed (``verify_costs.MeasuredCosts.seed``: a server timed while
another starts beside it, as the main job's two do, sees slow steps). The draft's cost is
left to its first drafting step. ``SPECSERVE_K_WARM_START=0`` (read when a server starts)
keeps the cold start, e.g. to compare both.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.models.decoder import DecoderLM
from specserve.spec_decode.k_controller import KController

SWITCH = "SPECSERVE_K_WARM_START"
CONTEXT = 64  # cached tokens the timed steps run after (a short chat prompt)
REPEATS = 2  # timings per step size; the best counts (the first also warms the size up)


def enabled() -> bool:
    """Whether servers time their target's steps at start (``SPECSERVE_K_WARM_START``)."""
    return os.environ.get(SWITCH, "1") != "0"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def time_verify_steps(
    model: DecoderLM, num_sizes: int, context: int = CONTEXT, repeats: int = REPEATS
) -> list[float]:
    """Seconds of ``model``'s forward over T = 1 .. ``num_sizes`` new tokens after ``context``
    cached ones, logits of every row included: the best of ``repeats`` timings each.

    Raises:
        ValueError: ``num_sizes``, ``context`` or ``repeats`` below 1.
    """
    if num_sizes < 1 or context < 1 or repeats < 1:
        raise ValueError(
            f"need num_sizes, context and repeats >= 1, got {num_sizes}, {context}, {repeats}"
        )
    vocab = model.cfg.vocab_size
    ids = [(7 + 31 * i) % vocab for i in range(context + num_sizes)]  # fixed, any valid ids
    cache = SingleSequenceCache(model, context + num_sizes)
    cache.forward(ids[:context])
    seconds = []
    for size in range(1, num_sizes + 1):
        best = float("inf")
        for _ in range(repeats):
            cache.truncate(context)
            _synchronize(model.device)
            t0 = time.perf_counter()
            model.compute_logits(cache.forward(ids[context : context + size]))
            _synchronize(model.device)
            best = min(best, time.perf_counter() - t0)
        seconds.append(best)
    return seconds


def seed(controller: KController, seconds: Sequence[float]) -> None:
    """Give ``controller`` ``seconds[T - 1]`` as its estimate of a forward over T tokens of
    one request, for each T, until a live step of that size replaces it (a controller with a
    fixed k needs none and gets none)."""
    if controller.fixed_k is not None:
        return
    for size, s in enumerate(seconds, start=1):
        if s <= 0:
            raise ValueError(f"a step time must be positive, got {s} for {size} tokens")
        controller.costs.seed(size, s)


def warm(controller: KController, model: DecoderLM) -> list[float]:
    """Time ``model``'s steps of 1 .. ``controller.k_max + 1`` tokens and seed ``controller``
    with them; returns the seconds (empty where the controller needs none)."""
    if controller.fixed_k is not None or controller.k_max == 0:
        return []
    seconds = time_verify_steps(model, controller.k_max + 1)
    seed(controller, seconds)
    return seconds
