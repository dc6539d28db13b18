"""Stage 1 and 2 of training a head: the target writes its replies, and the hidden states the
head learns from are recorded by the very forwards that write them.

The conversations run through the batched engine at temperature 0 (continuous batching,
``max_num_seqs`` at a time) with :meth:`LLMEngine.record_hidden` on: every prefill and decode
forward captures the target's hidden states of its tokens, and a finished request hands back
those of all its positions. On the fused native path a row's numbers do not depend on the
rows beside it, so these are, bit for bit, what one teacher-forced pass over prompt + reply
would compute, and what the served target computes when the head drafts; recording them
here saves that second pass over every token.

A conversation with a given reply (``Conversation.reply``) is not generated: prompt and
reply are read in one prefill (the request asks for a single token, which is dropped), whose
hidden states are recorded the same way, and each position is labelled with the target's own
next token there: the argmax of its logits, from the recorded final hidden state and the
target's LM head (one matmul per 256 positions). A generated reply needs no labels: at
temperature 0 its next token *is* the target's argmax.

Output: shards ``gen-NNNN.safetensors`` in the work directory (per sequence ``tokens.<i>``
int32 ``# [T]``, ``hidden.<i>`` ``# [T - 1, features]`` stored as bf16, for a given reply
``targets.<i>`` int32 ``# [T]``, and the prompt length in the metadata), plus
``generation.json`` listing the conversations done; a rerun skips those (resume).

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
    targets: torch.Tensor | None = None  # [T] int64: the target's own token at each position
    # (position 0 keeps its token); None: the tokens are the target's own (a generated reply)

    @property
    def labels(self) -> torch.Tensor:
        """``# [T]`` the token the target writes at each position: what a head learns."""
        return self.tokens if self.targets is None else self.targets


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
        if s.targets is not None:
            tensors[f"targets.{i}"] = s.targets.to(torch.int32)
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
            keys = set(f.keys())
            for i, (sid, plen) in enumerate(zip(ids, lens, strict=True)):
                targets = None
                if f"targets.{i}" in keys:
                    targets = f.get_tensor(f"targets.{i}").to(torch.long)
                out.append(
                    Sequence_(
                        sid,
                        f.get_tensor(f"tokens.{i}").to(torch.long),
                        f.get_tensor(f"hidden.{i}"),
                        int(plen),
                        targets,
                    )
                )
    return out


def target_tokens(
    ids: Sequence[int], hidden: torch.Tensor, lm_head: torch.Tensor, chunk: int = 256
) -> torch.Tensor:
    """``# [T]``: ``ids[0]``, then at each position p + 1 the target's argmax after p, from the
    final hidden states (the last ``hidden_size`` columns of ``hidden # [T - 1, features]``)
    and its LM head ``# [vocab, hidden_size]``."""
    h = lm_head.shape[1]
    final = hidden[:, -h:]
    out = torch.empty(len(ids), dtype=torch.long)
    out[0] = ids[0]
    with torch.no_grad():
        for start in range(0, final.shape[0], chunk):
            rows = final[start : start + chunk].to(lm_head.device, lm_head.dtype)
            out[start + 1 : start + 1 + rows.shape[0]] = (rows @ lm_head.T).argmax(-1).cpu()
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
    lm_head: torch.Tensor | None = None,
    progress: Callable[[str], None] = print,
) -> dict[str, float]:
    """Generate the target's replies to ``conversations`` not yet in ``work`` (or read the
    given ones) and record the hidden states ``layers`` (see the module docstring).

    Args:
        lm_head: ``# [vocab, hidden]`` the target's LM head, dense; needed when a
            conversation has a given reply (its positions are labelled with it). The last of
            ``layers`` must then be the final (normed) output.

    Returns:
        ``{"sequences": n, "tokens": reply tokens generated or read, "seconds": s}`` of this
        call.
    Raises:
        ValueError: ``work`` holds data recorded for other hidden-state layers, or a given
            reply without ``lm_head``.
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
    read_once = SamplingParams(temperature=0.0, max_tokens=1)  # a given reply: prefill only
    prompts = {c.id: tok.encode_chat(c.as_chat()) for c in todo}
    reply_start: dict[str, int] = {}  # given replies: where the reply starts in prompts[id]
    for c in todo:
        if c.reply is None:
            continue
        if lm_head is None:
            raise ValueError(f"conversation {c.id} has a given reply: its labels need lm_head")
        # The reply is tokenized on its own after the prompt's tokens, as served text is
        # (tokenizing the whole can merge the prompt's last characters into the reply's).
        prompt_text = tok.apply_chat_template(c.as_chat())
        whole_text = tok.apply_chat_template(c.with_reply(), add_generation_prompt=False)
        if not whole_text.startswith(prompt_text) or len(whole_text) == len(prompt_text):
            logger.warning("conversation %s: the chat template does not end the prompt where "
                           "the reply starts; skipped", c.id)  # fmt: skip
            prompts[c.id] = []
            continue
        reply_start[c.id] = len(prompts[c.id])
        rest = tok.encode(whole_text[len(prompt_text) :], add_special_tokens=False)
        prompts[c.id] = prompts[c.id] + rest
    too_long = [cid for cid, ids in prompts.items() if len(ids) + 2 > engine.max_model_len]
    for cid in too_long:
        logger.warning("conversation %s: prompt longer than the context, skipped", cid)
    queue = [c.id for c in todo if c.id not in too_long and prompts[c.id]]
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
                engine.add_request(cid, prompts[cid], read_once if cid in reply_start else params)
                out_tokens[cid] = []
            for out in engine.step():
                cid = out.request_id
                out_tokens[cid].extend(out.new_token_ids)
                if not out.finished:
                    continue
                ids = prompts[cid] + out_tokens.pop(cid)
                if out.hidden_states is None or len(out.hidden_states) != len(ids) - 1:
                    logger.warning("conversation %s: no hidden states recorded", cid)
                    continue
                hidden = out.hidden_states.to("cpu", torch.bfloat16)  # a copy, half the size
                if cid in reply_start:  # drop the one generated token; label every position
                    ids, hidden = prompts[cid], hidden[: len(prompts[cid]) - 1]
                    assert lm_head is not None
                    seq = Sequence_(cid, torch.tensor(ids), hidden, reply_start[cid],
                                    target_tokens(ids, hidden, lm_head))  # fmt: skip
                else:
                    seq = Sequence_(cid, torch.tensor(ids), hidden, len(prompts[cid]))
                pending.append(seq)
                n_seqs += 1
                n_tokens += len(seq.tokens) - seq.prompt_len
                if len(pending) >= shard_size:
                    flush()
                    elapsed = time.perf_counter() - t0
                    progress(
                        f"record: {len(manifest['done'])}/{len(conversations)} conversations, "
                        f"{n_tokens} tokens in {elapsed:.0f} s ({n_tokens / elapsed:.1f} tok/s)"
                    )
    finally:
        flush()  # what finished survives an interruption
    return {"sequences": n_seqs, "tokens": n_tokens, "seconds": time.perf_counter() - t0}
