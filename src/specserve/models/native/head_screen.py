"""A greedy draft's LM head, screened in two-bit codes and finished exactly on a few rows.

A draft model proposes; the target decides. A greedy draft needs only its top token and that
token's probability (the confidence stop of ``spec_decode/draft_model.py``), yet its int4
LM head reads a quarter of a draft token's bytes (the 0.5B's 151,936 x 896 rows: 76 MB of
about 280). :class:`HeadScreen` keeps a copy of the head in two-bit codes with fp16
constants per group of 64 inputs (2.5 bits a weight, half the int4 head's 5), built once
from the head itself. Per draft row the native op ``head_screen`` (``csrc/head_screen.cpp``)
ranks every vocabulary row by that coarse product and returns the :data:`TOP_N` best, their
top score and the softmax mass of the others; :func:`greedy` then computes those candidates'
logits with the head's own int4 kernel on just their tiles of 16 rows (a row's result does
not depend on which other rows a call computes, so they are the full head's logits bit for
bit), and takes the top one.

So the draft proposes the full head's top token whenever it is among the candidates (the
benchmark ``benchmarks/draft_head.py`` counts how often it is), and its confidence is the
full softmax's up to the coarse scores of the rows outside them. What the target commits never
depends on it: a proposal is only checked. ``SPECSERVE_DRAFT_HEAD_SCREEN=0`` (read when the
draft is set up and on every call) uses the full head. Sampled (temperature > 0) requests
always use the full head, whose whole distribution they need.
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass

import torch

from specserve.models.native import int4_native
from specserve.models.native.env_switch import switched_off
from specserve.models.native.int4_native import Int4Packed
from specserve.models.quant.layers import Int4Linear

logger = logging.getLogger(__name__)

__all__ = [
    "SWITCH",
    "TOP_N",
    "HeadScreen",
    "describe",
    "for_head",
    "greedy",
    "pack",
    "screen",
    "why_not",
]

SWITCH = "SPECSERVE_DRAFT_HEAD_SCREEN"
TOP_N = 64  # candidates per row finished exactly
GROUP = 64  # inputs per group of two-bit codes
TILE = int4_native.TILE_ROWS


@dataclass(frozen=True)
class HeadScreen:
    """The two-bit copy of an int4 LM head and the head it screens.

    Attributes:
        codes: ``# [Np / 16, K / 64, 5, 64] uint8``: per tile of 16 rows and group of 64
            inputs four blocks of codes and one of the rows' fp16 scales and minimums
            (``csrc/head_screen.cpp`` gives the byte order).
        head: the exact head (the int4 kernel's packed weight).
    """

    codes: torch.Tensor
    head: Int4Packed

    @property
    def out_features(self) -> int:
        """The head's rows."""
        return self.head.out_features

    @property
    def top_n(self) -> int:
        """Candidates per input row."""
        return min(TOP_N, self.out_features)

    @property
    def nbytes(self) -> int:
        return self.codes.numel()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight # [N, K]`` (float, K a multiple of 64) -> the screen's ``codes``: per row and
    group ``w ~ q·s + mn`` with ``q`` in 0..3, ``mn`` the group's minimum and ``s`` a third
    of its range (both fp16, the codes rounded against the fp16 values)."""
    n, k = weight.shape
    if k % GROUP:
        raise ValueError(f"the screen needs inputs in groups of {GROUP}, got {k}")
    tiles = -(-n // TILE)
    codes = torch.zeros(tiles, k // GROUP, 5, 64, dtype=torch.uint8)
    for g in range(k // GROUP):
        codes[:, g] = _pack_group(weight[:, g * GROUP : (g + 1) * GROUP].float(), tiles)
    return codes


def _pack_group(w: torch.Tensor, tiles: int) -> torch.Tensor:
    """One group's five blocks per tile, ``# [tiles, 5, 64] uint8``, from ``w # [N, 64]``."""
    pad = tiles * TILE - w.shape[0]
    w = torch.nn.functional.pad(w, (0, 0, 0, pad))
    lo, hi = w.amin(-1), w.amax(-1)
    mn = lo.half()
    s = ((hi - lo) / 3).half()
    span = s.float()
    q = torch.where(span[:, None] > 0, (w - mn.float()[:, None]) / span[:, None], 0.0)
    q = q.round().clamp(0, 3).to(torch.uint8)  # [Np, 64]
    # block b, byte 4 i + e, bits 2 j: q[row i, 16 b + 4 j + e]
    q = q.view(tiles, TILE, 4, 4, 4).permute(0, 2, 1, 4, 3)  # [tiles, b, i, e, j]
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)
    blocks = (q << shifts).sum(-1, dtype=torch.uint8).reshape(tiles, 4, 64)
    consts = torch.stack([s.view(tiles, TILE), mn.view(tiles, TILE)], 1)  # [tiles, 2, 16]
    return torch.cat([blocks, consts.contiguous().view(torch.uint8).view(tiles, 1, 64)], 1)


_BUILD_TILES = 512  # tiles of the head dequantised at a time (bounds the build's memory)


def _tile_range(packed: Int4Packed, t0: int, t1: int) -> Int4Packed:
    """Tiles ``t0 .. t1 - 1`` of a packed int4 weight (rows ``16 t0 ..``), as one (views)."""
    return Int4Packed(
        packed.qweight[t0:t1],
        packed.scales if packed.inline_constants else packed.scales[t0:t1],
        packed.row_scale[t0 * TILE : t1 * TILE],
        (t1 - t0) * TILE,
        packed.group_size,
    )


def _dequantised(packed: Int4Packed, g: int) -> torch.Tensor:
    """Group ``g``'s weights ``# [rows, 64]`` fp32 of a packed int4 weight: its own kernel
    applied to the group's rows of the identity (so whatever its packed form)."""
    eye = torch.zeros(GROUP, packed.in_features)
    eye[:, g * GROUP : (g + 1) * GROUP] = torch.eye(GROUP)
    return int4_native.matmul(eye, packed).T  # fp32 in, fp32 out


# One screen per head, built on first use (each new proposer of the same draft model reuses it).
_SCREENS: weakref.WeakKeyDictionary[torch.nn.Module, HeadScreen] = weakref.WeakKeyDictionary()


def for_head(linear: torch.nn.Module) -> HeadScreen | None:
    """The screen of a draft model's LM head (built once per head: about 2 s for the 0.5B's),
    or None where it does not apply (logged at debug): switched off, not an int4 head on the
    native kernel, inputs not in groups of 64, or the op library without ``head_screen``."""
    why = why_not(linear)
    if why is not None:
        logger.debug("draft head screen off: %s", why)
        return None
    if linear not in _SCREENS:
        _SCREENS[linear] = _build(linear)
    return _SCREENS[linear]


def describe(linear: torch.nn.Module) -> str:
    """How a greedy draft with this LM head computes its top token, for logs and
    ``/metrics``: screened (a screen was built for it) or the full head."""
    hs = _SCREENS.get(linear)
    if hs is None:
        return "full head"
    return f"screened: two-bit codes ({hs.nbytes / 1e6:.0f} MB), top {hs.top_n} exact"


def _build(linear: torch.nn.Module) -> HeadScreen:
    assert isinstance(linear, Int4Linear) and linear.native is not None
    start = time.perf_counter()
    n, k = linear.out_features, linear.in_features
    tiles = -(-n // TILE)
    codes = torch.zeros(tiles, k // GROUP, 5, 64, dtype=torch.uint8)
    with torch.inference_mode():
        for t0 in range(0, tiles, _BUILD_TILES):
            t1 = min(tiles, t0 + _BUILD_TILES)
            part = _tile_range(linear.native, t0, t1)
            for g in range(k // GROUP):
                codes[t0:t1, g] = _pack_group(_dequantised(part, g), t1 - t0)
    logger.info(
        "draft LM head screened in two-bit codes (%.0f MB beside the head's %.0f MB), "
        "top %d finished exactly; built in %.1f s", codes.numel() / 1e6,
        linear.native.qweight.numel() / 1e6, min(TOP_N, n), time.perf_counter() - start,
    )  # fmt: skip
    return HeadScreen(codes, linear.native)


def why_not(linear: torch.nn.Module) -> str | None:
    """Why ``linear`` gets no screen (:func:`for_head`), or None where it does."""
    if switched_off(SWITCH):
        return f"{SWITCH}=0"
    if not isinstance(linear, Int4Linear) or linear.native is None:
        return "the LM head is not an int4 weight on the native kernel"
    if linear.in_features % GROUP:
        return f"{linear.in_features} inputs are not groups of {GROUP}"
    if not int4_native.available() or not hasattr(torch.ops.specserve, "head_screen"):
        return "the native op library is not loaded"
    return None


def screen(x: torch.Tensor, hs: HeadScreen, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x # [M, K]`` bf16 -> ``(candidates # [M, top_n] int64, stats # [M, 3] fp32)``: per row
    the rows of the best coarse scores, the one of the highest exact logit below ``vocab``
    first (ties to the lower row), and ``(its probability, the best coarse score, the sum of
    exp(score - best) over the rows not among the candidates)``; probability 0 where no
    candidate is below ``vocab``."""
    cand = torch.empty(x.shape[0], hs.top_n, dtype=torch.long)
    head = hs.head
    stats = torch.ops.specserve.head_screen(
        x.contiguous(), hs.codes, hs.out_features, vocab, hs.top_n, head.qweight, head.scales,
        head.row_scale, head.group_size, head.tile_mode(x.shape[0]), cand,
    )  # fmt: skip
    return cand, stats


def greedy(x: torch.Tensor, hs: HeadScreen, vocab: int) -> tuple[list[int], list[float]] | None:
    """Per row of ``x # [M, K]``: the top token among the candidates below ``vocab`` and its
    probability (the candidates' exact logits, the other rows' coarse scores); None where a
    row has none below ``vocab`` or its probability is not a positive number (the caller
    then uses the full head)."""
    cand, stats = screen(x, hs, vocab)
    tokens, conf = cand[:, 0].tolist(), stats[:, 0].tolist()
    return (tokens, conf) if all(c > 0 for c in conf) else None
