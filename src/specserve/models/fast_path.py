"""Less overhead per decode/verify step: precomputed RoPE tables, ``torch.compile`` of the
decoder forward, thread settings, and a profiler breakdown of one step.

Terms:
    step overhead: wall time of a forward that is not spent reading weights — Python
        dispatch of ~45 small ops per layer, temporaries, RoPE recomputation. At batch 1 a
        1.5B int4 model reads ~0.9 GB per token (~25 ms at 35 GB/s), so milliseconds matter.
        (int4 bf16 models on the native kernel skip most of it: models/native/fused_layer.py runs
        each layer of a decode or verify step as one op.)

Everything here keeps the call contract of :class:`DecoderLM` (``model(ids, meta, kv)``),
so generation, the engine, draft proposers and the oracle use an optimised model unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from specserve.models.cache_tensors import KVCacheTensors
from specserve.models.decoder import AttentionMetadata, DecoderLM
from specserve.models.norm_rope import RotaryEmbedding

logger = logging.getLogger(__name__)


class CachedRotary(nn.Module):
    """RoPE cos/sin looked up from tables computed once for positions ``0..max_positions-1``.

    The tables are built with the same elementwise operations as :class:`RotaryEmbedding`,
    so a lookup returns what the original computes for that position.
    """

    def __init__(self, rotary: RotaryEmbedding, max_positions: int, dtype: torch.dtype) -> None:
        super().__init__()
        inv_freq = rotary.inv_freq
        positions = torch.arange(max_positions, device=inv_freq.device)
        freqs = positions.float().unsqueeze(-1) * inv_freq  # [P, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [P, hd]
        self.max_positions = max_positions
        self.inv_freq = inv_freq
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", emb.cos().to(dtype), persistent=False)
        self.register_buffer("sin", emb.sin().to(dtype), persistent=False)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``# [B, T, head_dim]`` for ``positions # [B, T]``."""
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)


class InvariantContextForward:
    """Batch-1 forward whose numbers for a token do not depend on how tokens are chunked.

    Why: attention reduces over the context slots it is given. A decode step at position p
    gets p + 1 of them; a verification of positions p..p+k gets p + k + 1 for every row, the
    extra keys masked. Masked keys add exact zeros, but a different reduction length
    changes the summation order, so bf16 rounding differs and near-ties flip (observed with
    int8 weights). Here every token at position p attends over exactly
    ``bucket(p) = ceil((p + 1) / bucket_size) * bucket_size`` slots (the extra ones point at
    the scratch slot and are masked); a chunk whose rows fall in different buckets runs as
    one forward per bucket. With row-independent linears (weight-only int8/int4, see
    models/quant/layers.py) verify and decode then compute identical hidden states.

    Batches of several sequences pass through unchanged (their context is padded to the
    longest row, which this cannot undo).
    """

    def __init__(self, forward: Callable[..., torch.Tensor], bucket_size: int = 128) -> None:
        if bucket_size < 1:
            raise ValueError(f"bucket_size must be >= 1, got {bucket_size}")
        self.forward = forward
        self.bucket_size = bucket_size

    def _bucket(self, position: int) -> int:
        return -(-(position + 1) // self.bucket_size) * self.bucket_size

    def __call__(
        self, input_ids: torch.Tensor, meta: AttentionMetadata, kv: KVCacheTensors
    ) -> torch.Tensor:
        if input_ids.shape[0] != 1:
            return self.forward(input_ids, meta, kv)
        # Host sync on the positions (free on CPU; one per forward on an accelerator).
        positions = meta.positions[0].tolist()
        buckets = [self._bucket(p) for p in positions]
        parts = []
        start = 0
        scratch = KVCacheTensors.SCRATCH_BLOCK * kv.block_size
        for end in range(1, len(positions) + 1):
            if end < len(positions) and buckets[end] == buckets[start]:
                continue
            s = buckets[start]
            ctx = meta.context_slots[:, :s]  # [1, <=s]
            if ctx.shape[1] < s:
                ctx = torch.nn.functional.pad(ctx, (0, s - ctx.shape[1]), value=scratch)
            sub = AttentionMetadata(
                meta.positions[:, start:end], meta.slot_mapping[:, start:end], ctx
            )
            parts.append(self.forward(input_ids[:, start:end], sub, kv))
            start = end
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


@dataclass(frozen=True)
class FastPathOptions:
    """How to optimise a model for decoding.

    Attributes:
        rope_tables: replace RoPE recomputation by table lookups.
        compile: wrap the forward in ``torch.compile`` (inductor; dynamic shapes, so a new
            context length does not recompile). The first forward of each new query length
            (1 for decode, k + 1 for verify) pays the compile time.
        num_threads: ``torch.set_num_threads`` value; None leaves the setting alone.
        invariant_context_bucket: if set, batch-1 forwards attend over a context length that
            depends only on each token's position (see :class:`InvariantContextForward`), so
            speculative greedy output equals plain greedy output with int8/int4 weights
            (attention itself already runs short chunks row by row, models/decoder.py).
    """

    rope_tables: bool = True
    compile: bool = False
    num_threads: int | None = None
    invariant_context_bucket: int | None = None

    def __post_init__(self) -> None:
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")


def optimize_for_decode(model: DecoderLM, options: FastPathOptions | None = None) -> DecoderLM:
    """Apply ``options`` to ``model`` in place and return it (idempotent for the tables)."""
    options = options or FastPathOptions()
    if options.num_threads is not None:
        torch.set_num_threads(options.num_threads)
    if options.rope_tables and isinstance(model.rotary, RotaryEmbedding):
        model.rotary = CachedRotary(  # type: ignore[assignment]  # same call contract
            model.rotary, model.cfg.max_position_embeddings, model.dtype
        )
    if options.compile and not getattr(model, "_specserve_compiled", False):
        # An instance attribute shadows the class's forward, so ``model(...)`` (nn.Module
        # __call__) runs the compiled graph while hooks and state_dict stay as they were.
        model.forward = torch.compile(model.forward, dynamic=True)  # type: ignore[method-assign]
        model._specserve_compiled = True  # type: ignore[assignment]
    bucket = options.invariant_context_bucket
    if bucket is not None and not isinstance(model.forward, InvariantContextForward):
        model.forward = InvariantContextForward(model.forward, bucket)  # type: ignore[method-assign]
    return model


@dataclass
class StepProfile:
    """Where the time of one forward goes.

    Attributes:
        step_ms: mean wall time of the profiled forwards.
        top_ops: ``(op name, self CPU ms per step, calls per step)`` of the costliest ops.
        num_ops_per_step: operator calls per forward (a proxy for dispatch overhead).
    """

    step_ms: float
    top_ops: list[tuple[str, float, float]]
    num_ops_per_step: float


def profile_step(run_step: Callable[[], object], num_steps: int = 5, top: int = 8) -> StepProfile:
    """Profile ``run_step`` (one forward) with ``torch.profiler``, after one warm-up call."""
    run_step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(num_steps):
            run_step()
        wall = time.perf_counter() - t0
    events = [e for e in prof.key_averages() if e.key.startswith(("aten::", "specserve::"))]
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    ops = [
        (e.key, e.self_cpu_time_total / 1e3 / num_steps, e.count / num_steps) for e in events[:top]
    ]
    calls = sum(e.count for e in events) / num_steps
    return StepProfile(wall * 1e3 / num_steps, ops, calls)
