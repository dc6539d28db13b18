"""``specserve train-draft`` end to end: generate, record, train, write the head directory.

Stages, each resumable from the work directory (:attr:`TrainDraftOptions.work_dir`):

1. **Generate** the target's replies at temperature 0 to the training conversations, and
2. **record** the target's hidden states of every position in the same forwards
   (``generate.py``): the low / middle / high layers EAGLE-3 reads and the final normed
   output Medusa reads are captured together, so one generation serves both methods.
3. **Train** the head (``objectives.py``, ``trainer.py``), one sequence in 20 held out for
   the accuracy curve.
4. **Write** the head directory (``loading/spec_heads.py``: the ``speculators`` EAGLE-3
   format, or vLLM's Medusa format) with ``training.json``: the command, the data, the time
   each stage took, the peak memory and the curve.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from specserve.config import HEAD_METHODS
from specserve.dtypes import torch_dtype
from specserve.loading.gguf_stored import default_format
from specserve.loading.head_writer import eagle3_head_config, medusa_head_config, write_head
from specserve.loading.loader import LoadedModel
from specserve.loading.quant_cache import load_in_format
from specserve.loading.spec_heads import default_aux_layer_ids
from specserve.models.decoder import DecoderLM
from specserve.models.eagle3 import Eagle3Config, Eagle3Head
from specserve.models.medusa import MedusaConfig, MedusaHeads
from specserve.train.data import (
    TrainingDataError,
    builtin_conversations,
    builtin_text_conversations,
    corpus_text,
    load_jsonl,
)
from specserve.train.generate import Sequence_, generate_training_data, load_sequences
from specserve.train.objectives import (
    draft_vocabulary,
    eagle3_loss,
    init_eagle3,
    init_medusa,
    medusa_loss,
    target_to_draft_map,
)
from specserve.train.trainer import TrainConfig, train

EVAL_EVERY = 20  # one sequence in this many is held out


@dataclass
class TrainDraftOptions:
    """What ``specserve train-draft`` was asked (see its ``--help``)."""

    model: str
    method: str
    output: Path
    data: Path | None = None
    num_prompts: int = 64
    replies: str = "generate"  # --data's replies: "generate" (the target writes) or "given"
    text_prompts: int = 0  # built-in conversations with given replies
    max_tokens: int = 160
    weights: str | None = None
    dtype: str = "bfloat16"
    device: str = "cpu"  # where the target generates and the head trains
    work: Path | None = None
    resume: bool = False
    max_num_seqs: int = 32
    draft_vocab_size: int = 32000
    ttt_steps: int = 2
    medusa_heads: int = 4
    medusa_layers: int = 1
    num_speculative_tokens: int = 5
    train: TrainConfig = field(default_factory=TrainConfig)
    command: str = ""

    @property
    def work_dir(self) -> Path:
        """Where generations and checkpoints go: by default one folder per target and data
        beside the output, so an EAGLE-3 and a Medusa head of one target share the
        generations (checkpoints are per method)."""
        if self.work is not None:
            return self.work
        model = Path(self.model).name.removesuffix(".gguf")
        data = self.data.stem if self.data is not None else "builtin"
        return self.output.parent / f".{model}.{data}.work"


def _data_description(opts: TrainDraftOptions) -> str:
    python = f"Python {sys.version.split()[0]}"
    parts = []
    if opts.data:
        parts.append(f"{opts.data} (replies: {opts.replies})")
    elif opts.num_prompts:
        parts.append(f"built-in: {opts.num_prompts} prompts from the {python} standard "
                     "library's sources, replies generated (specserve.train.data)")  # fmt: skip
    if opts.text_prompts:
        parts.append(
            f"built-in given replies: {opts.text_prompts} passages of the {python} "
            "documentation topics and function sources (specserve.train.data)"
        )
    return "; ".join(parts)


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def target_lm_head(model: DecoderLM) -> torch.Tensor:
    """The target's LM head as a dense ``# [vocab, hidden]`` matrix (a quantised head is
    read back through its own matmul of the identity)."""
    weight = getattr(model.lm_head, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dtype.is_floating_point:
        return weight.detach()
    h = model.cfg.hidden_size
    with torch.no_grad():
        return model.compute_logits(torch.eye(h, dtype=model.dtype)).T.contiguous()


def _on(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if t is None else t.to(device)


def recorded_layers(num_layers: int) -> tuple[int, ...]:
    """The hidden states one generation records: EAGLE-3's three, then the final output."""
    return (*default_aux_layer_ids(num_layers), num_layers)


def _vocab(opts: TrainDraftOptions, target: LoadedModel, seqs: list[Sequence_]) -> torch.Tensor:
    size = min(opts.draft_vocab_size, target.arch.vocab_size)
    replies = [int(t) for s in seqs for t in s.labels[s.prompt_len :]]
    corpus = target.tokenizer.encode(corpus_text(), add_special_tokens=False)
    return draft_vocabulary(size, target.arch.vocab_size, replies, corpus)


def run_train_draft(opts: TrainDraftOptions, progress: Callable[[str], None] = print) -> Path:
    """Train a head as ``opts`` says and write it to ``opts.output``; returns the path.

    Raises:
        TrainingDataError: no usable training data.
        CheckpointError: a checkpoint could not be written or resumed.
        ValueError / OSError: bad options, an unloadable target, an unwritable output.
        KeyboardInterrupt: after the last finished stage or checkpoint was saved.
    """
    if opts.method not in HEAD_METHODS:
        raise ValueError(f"unknown head method {opts.method!r}; known: {', '.join(HEAD_METHODS)}")
    if opts.replies not in ("generate", "given"):
        raise ValueError(f"replies must be 'generate' or 'given', not {opts.replies!r}")
    if opts.data is not None:  # bad data is an error before minutes of loading
        conversations = load_jsonl(opts.data, given_replies=opts.replies == "given")
    elif opts.num_prompts:
        conversations = builtin_conversations(opts.num_prompts, opts.train.seed)
    else:
        conversations = []
    if opts.text_prompts:
        conversations += builtin_text_conversations(opts.text_prompts, opts.train.seed)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    # The format `serve` would run the target in: a quantised GGUF's blocks as stored
    # (`gguf`) unless fp32 is asked for, so the head learns the hidden states it will read.
    weights = opts.weights or default_format(opts.model, opts.device, opts.dtype)
    target = load_in_format(opts.model, weights, torch_dtype(opts.dtype), opts.device)  # type: ignore[arg-type]
    timings["load_s"] = time.perf_counter() - t0
    arch = target.arch
    layers = recorded_layers(arch.num_layers)
    work = opts.work_dir
    if not opts.resume and (work / "generation.json").exists():
        progress(f"generate: reusing the {work} generations (delete it to start over)")
    given = any(c.reply is not None for c in conversations)
    gen = generate_training_data(
        target, conversations, work, layers,
        max_tokens=opts.max_tokens, max_num_seqs=opts.max_num_seqs, progress=progress,
        lm_head=target_lm_head(target.model) if given else None,
    )  # fmt: skip
    timings["generate_and_record_s"] = gen["seconds"]
    seqs = load_sequences(work)
    if not seqs:
        raise TrainingDataError("no training sequence was generated (every prompt was too long?)")
    progress(f"data: {len(seqs)} sequences, "
             f"{sum(len(s.tokens) - s.prompt_len for s in seqs)} reply tokens")  # fmt: skip

    t1 = time.perf_counter()
    vocab = _vocab(opts, target, seqs)
    dev = target.model.device
    target_to_draft = target_to_draft_map(vocab, arch.vocab_size).to(dev)
    h = arch.hidden_size
    torch.manual_seed(opts.train.seed)
    module: torch.nn.Module
    if opts.method == "eagle":
        cfg = Eagle3Config(
            hidden_size=h, intermediate_size=arch.intermediate_size, num_heads=arch.num_heads,
            num_kv_heads=arch.num_kv_heads, head_dim=arch.head_dim, target_hidden_size=h,
            aux_layer_ids=default_aux_layer_ids(arch.num_layers),
            target_vocab_size=arch.vocab_size, draft_vocab_size=len(vocab),
            rope_theta=arch.rope_theta, rms_norm_eps=arch.rms_norm_eps,
        )  # fmt: skip
        head = Eagle3Head(cfg)
        head.set_vocab_map(vocab)
        head.to(dev)
        init_eagle3(head, target.model, target_lm_head(target.model))
        head.d2t.requires_grad_(False)
        module, n_steps = head, opts.ttt_steps
        embed = target.model.model.embed_tokens

        def loss_fn(i: int) -> Any:
            s = seqs[i]
            hidden = s.hidden[:, : 3 * h].to(dev).float()
            return eagle3_loss(head, embed, s.tokens.to(dev), hidden, s.prompt_len,
                               target_to_draft, opts.ttt_steps,
                               targets=_on(s.targets, dev))  # fmt: skip

        extra: dict[str, Any] = {"method": "eagle", "config": asdict(cfg), "vocab": vocab.tolist()}
    else:
        mcfg = MedusaConfig(h, arch.vocab_size, opts.medusa_heads, opts.medusa_layers)
        heads = MedusaHeads(mcfg).to(dev)
        init_medusa(heads)
        lm_rows = target_lm_head(target.model)[vocab.to(dev)].float()
        module, n_steps = heads, opts.medusa_heads

        def loss_fn(i: int) -> Any:
            s = seqs[i]
            hidden = s.hidden[:, 3 * h :].to(dev)
            return medusa_loss(heads, lm_rows, s.tokens.to(dev), hidden, s.prompt_len,
                               target_to_draft, targets=_on(s.targets, dev))  # fmt: skip

        extra = {"method": "medusa", "config": asdict(mcfg), "vocab": vocab.tolist()}
    eval_idx = list(range(0, len(seqs), EVAL_EVERY))
    train_idx = [i for i in range(len(seqs)) if i not in set(eval_idx)] or eval_idx

    def tokens_of(i: int) -> int:
        return len(seqs[i].tokens) - seqs[i].prompt_len

    state = train(
        module, loss_fn, train_idx, eval_idx, n_steps, opts.train, work,
        resume=opts.resume, extra=extra, tokens_of=tokens_of, progress=progress,
        checkpoint_name=f"checkpoint-{opts.method}.pt",
    )  # fmt: skip
    timings["train_s"] = time.perf_counter() - t1
    training = {
        "method": opts.method,
        "target": opts.model,
        "target_weights": weights or opts.dtype,
        "command": opts.command or " ".join(sys.argv),
        "data": _data_description(opts),
        "sequences": {"train": len(train_idx), "held_out": len(eval_idx)},
        "reply_tokens": sum(tokens_of(i) for i in range(len(seqs))),
        "max_tokens": opts.max_tokens,
        "train_config": asdict(opts.train),
        "ttt_steps": opts.ttt_steps if opts.method == "eagle" else None,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "train_state": {"steps": state.step, "tokens_seen": state.tokens_seen},
        "peak_rss_gib": round(_peak_rss_gib(), 2),
        "curve": state.curve,
    }
    verifier_arch = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}.get(
        arch.family, "LlamaForCausalLM"
    )
    if opts.method == "eagle":
        assert isinstance(module, Eagle3Head)
        tensors = {k: v.detach().to("cpu", torch.bfloat16) if v.is_floating_point() else v.cpu()
                   for k, v in module.state_dict().items()}  # fmt: skip
        config = eagle3_head_config(
            module.cfg, verifier=opts.model, verifier_arch=verifier_arch,
            num_speculative_tokens=opts.num_speculative_tokens,
        )  # fmt: skip
    else:
        assert isinstance(module, MedusaHeads)
        tensors = {k: v.detach().to("cpu", torch.bfloat16) for k, v in module.state_dict().items()}
        tensors["lm_heads.0.weight"] = target_lm_head(target.model).to("cpu", torch.bfloat16)
        config = medusa_head_config(module.cfg, verifier=opts.model)
    write_head(opts.output, config, tensors, training)
    progress(
        f"wrote {opts.method} head to {opts.output} (load {timings['load_s']:.0f} s, generate + "
        f"record {timings['generate_and_record_s']:.0f} s, train {timings['train_s']:.0f} s, "
        f"peak RSS {training['peak_rss_gib']} GiB)"
    )
    return opts.output
