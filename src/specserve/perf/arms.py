"""The arms of ``specserve perf``: one function per engine, each returning :class:`ArmResult`.

Every arm runs the same prompt token ids, greedy, batch 1, on this machine, in one process
(llama.cpp and vLLM in child processes, see ``worker_arms.py``), so the printed ratios are
measured side by side.
"""

from __future__ import annotations

import itertools
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specserve.models.decoder import DecoderLM
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.plain_loop import GenerationResult, generate_plain

logger = logging.getLogger(__name__)


@dataclass
class ArmResult:
    """One engine/mode over all prompts.

    Attributes:
        name: row label (``specserve int4 draft k=adaptive``).
        token_ids: generated ids per prompt.
        decode_s: decode wall time per prompt (after the first token).
        prefill_s: time to the first token per prompt.
        num_forwards: target forwards per prompt after the first token (None: unknown).
        bytes_per_token: weight bytes one plain decode step reads (None: not a plain arm).
        error: why the arm did not run (the row says so instead of vanishing).
        round_tok_per_s: with ``--rounds``, per prompt the decode speed of every round in
            order (``run_interleaved``); empty otherwise.
        group: the arms alternated with it in one ``run_interleaved`` share it (the weight
            format); only ratios within a group are paired round by round.
    """

    name: str
    token_ids: list[list[int]] = field(default_factory=list)
    decode_s: list[float] = field(default_factory=list)
    prefill_s: list[float] = field(default_factory=list)
    num_forwards: list[int] | None = None
    bytes_per_token: int | None = None
    error: str | None = None
    round_tok_per_s: list[list[float]] = field(default_factory=list)
    group: str = ""

    def tok_per_s(self, i: int) -> float:
        n = len(self.token_ids[i]) - 1
        return n / self.decode_s[i] if n > 0 and self.decode_s[i] > 0 else 0.0

    def tokens_per_forward(self, i: int) -> float | None:
        if self.num_forwards is None or self.num_forwards[i] == 0:
            return None
        return (len(self.token_ids[i]) - 1) / self.num_forwards[i]


def measure_bandwidth_gbs(size_mib: int = 1024, repeats: int = 5) -> float:
    """Read bandwidth in GB/s: the best of ``repeats`` sums over a ``size_mib`` buffer.

    The buffer holds random numbers: a host may merge identical pages (``torch.ones``), and
    reads of a few shared physical pages come from cache. It lies in huge pages where the host
    allows (models/native/huge_pages.py), as the int4 weights do: over 4 KiB pages the same sum read
    4-10 % slower in ``benchmarks/int4_kernel.py --part thp``, TLB misses adding to the memory
    time. Readings still vary from run to run on a shared VM; compare them with the best
    achieved rate of a real decoder.
    """
    from specserve.models.native import huge_pages

    x = huge_pages.empty((size_mib * (1 << 20) // 4,), torch.float32).uniform_()
    x.sum()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best / 1e9


def decode_bytes_per_token(model: DecoderLM) -> int:
    """Bytes a batch-1 decode step reads: every parameter/buffer but the embedding table
    (one row is read) — an untied LM head counts, a tied one is read as the LM head."""
    seen: set[int] = set()
    total = 0
    embed = model.model.embed_tokens
    skip = {t.data_ptr() for t in [*embed.parameters(), *embed.buffers()]}
    skip |= {t.data_ptr() for t in model.rotary.buffers()}  # RoPE tables: one row per token
    head = model.lm_head
    head_ptrs = {t.data_ptr() for t in [*head.parameters(), *head.buffers()]}
    for t in [*model.parameters(), *model.buffers()]:
        ptr = t.data_ptr()
        if ptr in seen or (ptr in skip and ptr not in head_ptrs):
            continue
        if t.dim() >= 2 or ptr in head_ptrs or t.numel() > 4096:
            seen.add(ptr)
            total += t.numel() * t.element_size()
    return total


def arm_of_runs(
    name: str, runs: Iterable[GenerationResult], bytes_per_token: int | None = None
) -> ArmResult:
    """An arm from one in-process generation per prompt (``runs`` may be lazy: each run is
    made as it is collected), with the target forwards of each."""
    arm = ArmResult(name, num_forwards=[], bytes_per_token=bytes_per_token)
    for r in runs:
        arm.token_ids.append(r.token_ids)
        arm.decode_s.append(r.decode_s)
        arm.prefill_s.append(r.prefill_s)
        assert arm.num_forwards is not None
        arm.num_forwards.append(r.num_target_forwards)
    return arm


class ArmFailed(Exception):
    """An arm cannot go on (its worker process died): ``run_interleaved`` prints it as not
    run, with this message, and goes on with the other arms."""


@dataclass
class InProcessArm:
    """An arm that ``run_interleaved`` alternates with others: ``run(i, prompt_ids)`` decodes
    prompt ``i`` once (each call starts afresh: a new cache, proposer state and k controller),
    in this process or by asking a long-lived worker (llama.cpp, ``worker_arms.py``)."""

    name: str
    run: Callable[[int, list[int]], GenerationResult]
    bytes_per_token: int | None = None


def plain_arm(
    name: str, model: DecoderLM, params: SamplingParams, eos: tuple[int, ...]
) -> InProcessArm:
    return InProcessArm(
        name,
        lambda i, ids: generate_plain(model, ids, params, eos),
        decode_bytes_per_token(model),
    )


def spec_arm(
    name: str,
    target: DecoderLM,
    proposer_factory: Callable[[], Any],
    k: int | Callable[[], Any],
    params: SamplingParams,
    eos: tuple[int, ...],
) -> InProcessArm:
    """Unfused speculative loop (``spec_decode/speculative_loop.py``); ``k`` an int or a
    controller factory (a new controller per decode, as a new server would start)."""
    from specserve.spec_decode.speculative_loop import generate_speculative

    def run(i: int, ids: list[int]) -> GenerationResult:
        kk = k() if callable(k) else k
        return generate_speculative(
            target, proposer_factory(), ids, params, eos, kk, request_id=str(i)
        )

    return InProcessArm(name, run)


def fused_arm(
    name: str,
    target: DecoderLM,
    draft: DecoderLM,
    k: int,
    params: SamplingParams,
    eos: tuple[int, ...],
) -> InProcessArm:
    from specserve.spec_decode.fused_loop import generate_fused_greedy

    return InProcessArm(
        name, lambda i, ids: generate_fused_greedy(target, draft, ids, params, eos, k)
    )


def run_interleaved(
    arms: Sequence[InProcessArm],
    prompts: list[list[int]],
    rounds: int = 1,
    on_run: Callable[[str, int, GenerationResult], None] | None = None,
) -> list[ArmResult]:
    """Decode every prompt with every arm, ``rounds`` times, interleaved so that the arms of
    one prompt run seconds apart: a round takes the prompts in order and, for each, the arms
    one after the other (in reverse order every other round, so that no arm always follows
    the same one). Per arm and prompt the result is the median run by decode time (its
    tokens, forwards and times together); on a host whose speed drifts over minutes that
    keeps the arms' ratios from following the drift.

    Raises:
        ValueError: ``rounds`` < 1.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    runs: dict[tuple[int, int], list[GenerationResult]] = {}
    failed: dict[int, str] = {}
    for r in range(rounds):
        order = list(enumerate(arms)) if r % 2 == 0 else list(enumerate(arms))[::-1]
        for i, ids in enumerate(prompts):
            for a, arm in order:
                if a in failed:
                    continue
                try:
                    result = arm.run(i, ids)
                except ArmFailed as e:
                    logger.warning("%s: %s", arm.name, e)
                    failed[a] = str(e)
                    continue
                if on_run is not None:
                    on_run(arm.name, i, result)
                runs.setdefault((a, i), []).append(result)
    out: list[ArmResult] = []
    for a, arm in enumerate(arms):
        if a in failed:
            out.append(ArmResult(arm.name, error=failed[a]))
            continue
        median_runs = []
        for i in range(len(prompts)):
            rs = runs[(a, i)]
            if any(x.token_ids != rs[0].token_ids for x in rs):
                # Possible where verify rows round differently from decode rows (the eager
                # fp32 path) and the arm's k differed between rounds: said, not hidden.
                logger.warning(
                    "%s: prompt %d decoded to different tokens across rounds", arm.name, i
                )
            median_runs.append(sorted(rs, key=lambda x: x.decode_s)[(len(rs) - 1) // 2])
        measured = arm_of_runs(arm.name, median_runs, arm.bytes_per_token)
        measured.round_tok_per_s = [
            [r.decode_tokens_per_s for r in runs[(a, i)]] for i in range(len(prompts))
        ]
        out.append(measured)
    return out


def paired_ratio(arm: ArmResult, reference: ArmResult, prompt: int) -> float | None:
    """The arm's speed against the reference's, from the rounds' ratios (the two ran seconds
    apart in each round); None without rounds on both.

    ``run_interleaved`` reverses the arms' order every other round, so two adjacent rounds ran
    the pair in opposite orders: the geometric mean of their two ratios cancels a host speed
    that drifts steadily over the pair, which favours whichever arm runs second (in a
    ``--rounds 9`` run on the AVX2 host, while the host sped up over the run, the second arm
    of a round was the faster in 7 rounds of 9, and the median of the single rounds' ratios
    moved by the few per cent that decide a 0.97x floor). The result is the median of those
    means over every adjacent pair of rounds; with one round, its ratio.
    """
    mine, ref = arm.round_tok_per_s, reference.round_tok_per_s
    if len(mine) <= prompt or len(ref) <= prompt:
        return None
    ratios = [a / b if b > 0 else None for a, b in zip(mine[prompt], ref[prompt], strict=True)]
    if len(ratios) == 1:
        return ratios[0]
    means = [
        math.sqrt(x * y) for x, y in itertools.pairwise(ratios) if x is not None and y is not None
    ]
    return statistics.median(means) if means else None


def hf_from_decoder(model: DecoderLM):  # type: ignore[no-untyped-def]
    """A transformers model sharing ``model``'s float weights (no copy)."""
    import transformers

    cfg = model.cfg
    classes = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[cfg.family]
    hf_cfg = getattr(transformers, f"{classes}Config")(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_word_embeddings,
        torch_dtype=model.dtype,
        eos_token_id=list(cfg.eos_token_ids) or None,
        pad_token_id=0,
    )
    with torch.device("meta"):
        hf = getattr(transformers, f"{classes}ForCausalLM")(hf_cfg)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("rotary")}
    hf.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        hf.tie_weights()
    if any(buf.is_meta for buf in hf.buffers()):  # rotary inv_freq was made on meta: rebuild
        hf.model.rotary_emb = type(hf.model.rotary_emb)(config=hf_cfg)
    return hf.eval()


def run_transformers(
    name: str,
    hf,
    prompts: list[list[int]],
    max_tokens: int,
    eos: tuple[int, ...],  # type: ignore[no-untyped-def]
    assistant=None,
    prompt_lookup: int | None = None,  # type: ignore[no-untyped-def]
) -> ArmResult:
    arm = ArmResult(name)
    kwargs: dict[str, object] = {"do_sample": False, "eos_token_id": list(eos) or None}
    if assistant is not None:
        kwargs["assistant_model"] = assistant
    if prompt_lookup:
        kwargs["prompt_lookup_num_tokens"] = prompt_lookup
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            t0 = time.perf_counter()
            hf.generate(x, max_new_tokens=1, attention_mask=torch.ones_like(x), **kwargs)
            t1 = time.perf_counter()
            out = hf.generate(
                x, max_new_tokens=max_tokens, attention_mask=torch.ones_like(x), **kwargs
            )
            t2 = time.perf_counter()
            arm.token_ids.append(out[0, len(ids) :].tolist())
            arm.prefill_s.append(t1 - t0)
            arm.decode_s.append(max(t2 - t1 - (t1 - t0), 1e-9))
    return arm
