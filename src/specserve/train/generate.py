"""Stage 1 and 2 of training a head: the target writes its replies, and the hidden states the
head learns from are recorded by the very forwards that write them.

The conversations run through the batched engine at temperature 0 (continuous batching,
``max_num_seqs`` at a time) with :meth:`LLMEngine.record_hidden` on: every prefill and decode
forward captures the target's hidden states of its tokens, and a finished request hands back
those of all its positions. On the fused native path a row's numbers do not depend on the
rows beside it, so these are, bit for bit, what one teacher-forced pass over prompt + reply
would compute, and what the served target computes when the head drafts; recording them
here saves that second pass over every token.

Output: shards ``gen-NNNN.safetensors`` in the work directory (per sequence ``tokens.<i>``
int32 ``# [T]`` and ``hidden.<i>`` ``# [T - 1, features]`` stored as bf16, and the prompt
length in the metadata), plus ``generation.json`` listing the conversations done; a rerun
skips those (resume).

Which format and dtype generate is the caller's choice (``train-draft --weights/--dtype``;
by default the format ``serve`` runs the target in, so the head learns the hidden states it
will read). Many rows at once (``max_num_seqs`` replies, prompt chunks) are compute bound:
on a CPU without AVX-512 BF16, PyTorch's fp32 matmuls outrun the native kernels made for
short decode steps, at about twice the weights' memory; the hidden states of the formats
differ by rounding and quantisation, far below what a head learns from.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specserve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from specserve.engine.builder import build_engine_from_models
from specserve.loading.loader import LoadedModel
from specserve.sampling_params import SamplingParams
from specserve.train.data import Conversation

logger = logging.getLogger(__name__)

MANIFEST = "generation.json"


@dataclass(frozen=True)
class Sequence_:
    """One generated training sequence: prompt + reply tokens and the target's hidden states
    of every position but the last."""

    id: str
    tokens: torch.Tensor  # [T] int64
    hidden: torch.Tensor  # [T - 1, features]
    prompt_len: int


def _read_manifest(work: Path) -> dict[str, Any]:
    path = work / MANIFEST
    if not path.is_file():
        return {"layers": None, "shards": [], "done": []}
    return dict(json.loads(path.read_text()))


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def _write_shard(path: Path, seqs: Sequence[Sequence_]) -> None:
    tensors: dict[str, torch.Tensor] = {}
    for i, s in enumerate(seqs):
        tensors[f"tokens.{i}"] = s.tokens.to(torch.int32)
        tensors[f"hidden.{i}"] = s.hidden.contiguous()
    meta = {"ids": json.dumps([s.id for s in seqs]),
            "prompt_lens": json.dumps([s.prompt_len for s in seqs])}  # fmt: skip
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, path)


def load_sequences(work: Path) -> list[Sequence_]:
    """Every sequence generated into ``work`` so far, in order."""
    manifest = _read_manifest(work)
    out = []
    for name in manifest["shards"]:
        with safe_open(str(work / name), framework="pt") as f:
            meta = f.metadata()
            ids, lens = json.loads(meta["ids"]), json.loads(meta["prompt_lens"])
            for i, (sid, plen) in enumerate(zip(ids, lens, strict=True)):
                out.append(
                    Sequence_(
                        sid,
                        f.get_tensor(f"tokens.{i}").to(torch.long),
                        f.get_tensor(f"hidden.{i}"),
                        int(plen),
                    )
                )
    return out


def generate_training_data(
    target: LoadedModel,
    conversations: Sequence[Conversation],
    work: Path,
    layers: Sequence[int],
    *,
    max_tokens: int,
    max_num_seqs: int = 8,
    shard_size: int = 16,
    progress: Callable[[str], None] = print,
) -> dict[str, float]:
    """Generate the target's replies to ``conversations`` not yet in ``work`` and record
    the hidden states ``layers`` (see the module docstring).

    Returns:
        ``{"sequences": n, "tokens": generated, "seconds": s}`` of this call.
    Raises:
        ValueError: ``work`` holds data recorded for other hidden-state layers.
    """
    work.mkdir(parents=True, exist_ok=True)
    manifest = _read_manifest(work)
    if manifest["layers"] is not None and list(manifest["layers"]) != list(layers):
        raise ValueError(
            f"{work} holds hidden states of layers {manifest['layers']}, not {list(layers)}; "
            "use another work directory"
        )
    manifest["layers"] = list(layers)
    done = set(manifest["done"])
    todo = [c for c in conversations if c.id not in done]
    if not todo:
        return {"sequences": 0, "tokens": 0, "seconds": 0.0}
    tok = target.tokenizer
    config = EngineConfig(
        model=ModelConfig(target.name),
        cache=CacheConfig(enable_prefix_caching=False, memory_bytes=1 << 30),
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs),
    )
    engine = build_engine_from_models(config, target.model, tok, model_name=target.name)
    engine.record_hidden(layers)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    prompts = {c.id: tok.encode_chat(c.as_chat()) for c in todo}
    too_long = [cid for cid, ids in prompts.items() if len(ids) + 2 > engine.max_model_len]
    for cid in too_long:
        logger.warning("conversation %s: prompt longer than the context, skipped", cid)
    queue = [c.id for c in todo if c.id not in too_long]
    pending: list[Sequence_] = []
    t0, n_tokens, n_seqs = time.perf_counter(), 0, 0
    out_tokens: dict[str, list[int]] = {}

    def flush() -> None:
        if not pending:
            return
        name = f"gen-{len(manifest['shards']):04d}.safetensors"
        _write_shard(work / name, pending)
        manifest["shards"].append(name)
        manifest["done"].extend(s.id for s in pending)
        _write_json_atomic(work / MANIFEST, manifest)
        pending.clear()

    try:
        while queue or engine.has_unfinished_requests():
            while queue and len(engine.requests) < max_num_seqs:
                cid = queue.pop(0)
                engine.add_request(cid, prompts[cid], params)
                out_tokens[cid] = []
            for out in engine.step():
                out_tokens[out.request_id].extend(out.new_token_ids)
                if not out.finished:
                    continue
                ids = prompts[out.request_id] + out_tokens.pop(out.request_id)
                if out.hidden_states is None or len(out.hidden_states) != len(ids) - 1:
                    logger.warning("conversation %s: no hidden states recorded", out.request_id)
                    continue
                pending.append(
                    Sequence_(
                        out.request_id,
                        torch.tensor(ids),
                        out.hidden_states.to(torch.bfloat16),  # a copy, half the size
                        len(prompts[out.request_id]),
                    )
                )
                n_seqs += 1
                n_tokens += len(ids) - len(prompts[out.request_id])
                if len(pending) >= shard_size:
                    flush()
                    elapsed = time.perf_counter() - t0
                    progress(
                        f"generate: {len(manifest['done'])}/{len(conversations)} conversations, "
                        f"{n_tokens} tokens in {elapsed:.0f} s ({n_tokens / elapsed:.1f} tok/s)"
                    )
    finally:
        flush()  # what finished survives an interruption
    return {"sequences": n_seqs, "tokens": n_tokens, "seconds": time.perf_counter() - t0}
