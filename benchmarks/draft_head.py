"""A greedy draft's LM head screened in two-bit codes, beside the full head, in one process.

Serve's default pair (the gguf 1.5B target, the draft in the format serve picks beside it,
set up as the engine builder does) decodes ``perf``'s prompts, plain and by draft speculation
at k = 4 with the screened head (``models/native/head_screen.py``, the default) and with the
full one (``SPECSERVE_DRAFT_HEAD_SCREEN=0``), alternated prompt by prompt and round by round
(``perf``'s ``run_interleaved``). It prints per prompt the ms per output token and the tokens
per target forward of both, their ratio, and whether every run's tokens equal plain's. Then,
over each prompt and the plain reply, a draft forward of one token with its head both ways
(ms, alternating), and at every position of those texts whether the screened head picks the
full head's top token and how far its probability (the confidence stop's input) moves.

    python benchmarks/draft_head.py --rounds 3

Run it alone on the machine: it measures time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from specserve.bench.suites import get_prompts
from specserve.config import DEFAULT_DRAFT_CONFIDENCE_THRESHOLD
from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.models.decoder import DecoderLM
from specserve.models.native import fused_layer, head_screen
from specserve.perf.arms import InProcessArm, plain_arm, run_interleaved, spec_arm
from specserve.perf.main import load_gguf_pair
from specserve.perf.options import PROMPT_SUITE
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.factory import make_proposer

SWITCH = head_screen.SWITCH


def switched(arm: InProcessArm, on: bool) -> InProcessArm:
    """``arm`` run with the screen on or off (the switch is read on every call)."""

    def run(i: int, ids: list[int]):  # type: ignore[no-untyped-def]
        os.environ[SWITCH] = "1" if on else "0"
        try:
            return arm.run(i, ids)
        finally:
            os.environ.pop(SWITCH, None)

    return InProcessArm(arm.name, run)


def head_both_ways(draft: DecoderLM, hs: head_screen.HeadScreen, ids: list[int], vocab: int):  # type: ignore[no-untyped-def]
    """Teacher-forced over ``ids``: (positions where the screened top token is the full head's,
    positions, largest |probability difference|, confidence-stop decisions that differ)."""
    cache = SingleSequenceCache(draft, len(ids) + 1)
    hidden = cache.forward(ids)
    same = flips = 0
    worst = 0.0
    for r in range(hidden.shape[0]):
        h = hidden[r : r + 1]
        logits = draft.compute_logits(h).float()[:, :vocab]
        top, best = logits.max(-1)
        conf = float(torch.exp(logits - top[:, None]).sum(-1).reciprocal())
        screened = head_screen.greedy(h, hs, vocab)
        assert screened is not None
        same += screened[0][0] == int(best)
        worst = max(worst, abs(screened[1][0] - conf))
        t = DEFAULT_DRAFT_CONFIDENCE_THRESHOLD
        flips += (screened[1][0] < t) != (conf < t)
    return same, hidden.shape[0], worst, flips


def forward_ms(
    draft: DecoderLM, cache: SingleSequenceCache, base: int, on: bool, vocab: int
) -> float:
    """One one-token draft forward after ``base`` tokens with its head as a greedy draft
    calls it (screened or full), ms."""
    cache.truncate(base)
    os.environ[SWITCH] = "1" if on else "0"
    t0 = time.perf_counter()
    h = cache.forward([5])[-1:]
    hs = head_screen.for_head(draft.lm_head) if on else None
    if hs is not None:
        head_screen.greedy(h, hs, vocab)
    else:
        logits = draft.compute_logits(h).float()
        top = logits.max(-1).values
        torch.exp(logits - top[:, None]).sum(-1).reciprocal().tolist()
    os.environ.pop(SWITCH, None)
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--prompts", default="palindrome,fizzbuzz,cat,json")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()

    target, draft, draft_fmt = load_gguf_pair(args.target, args.draft)
    hs = head_screen.for_head(draft.model.lm_head)
    if hs is None:
        raise SystemExit(f"no screen here: {head_screen.why_not(draft.model.lm_head)}")
    tm, dm, vocab = target.model, draft.model, target.model.cfg.vocab_size
    names = args.prompts.split(",")
    texts = [q.text for q in get_prompts(PROMPT_SUITE, names)]
    prompts = [target.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    eos = tuple(target.tokenizer.eos_token_ids)

    def proposer():  # type: ignore[no-untyped-def]
        return make_proposer(
            "draft", vocab, dm, max_model_len=4096,
            confidence_threshold=DEFAULT_DRAFT_CONFIDENCE_THRESHOLD,
        )  # fmt: skip

    spec = spec_arm("draft", tm, proposer, args.k, params, eos)
    arms = [
        plain_arm("plain", tm, params, eos),
        switched(InProcessArm(f"draft k={args.k}, screened head", spec.run), True),
        switched(InProcessArm(f"draft k={args.k}, full head", spec.run), False),
    ]
    print(
        f"{args.target} gguf, draft {args.draft} {draft_fmt} ({fused_layer.describe(dm)}); "
        f"screen {hs.nbytes / 1e6:.1f} MB, top {hs.top_n}; {args.rounds} rounds, medians"
    )
    plain, on, off = run_interleaved(arms, prompts, args.rounds)
    print("| prompt | ms a token, screened | full head | full / screened "
          "| tokens a forward (screened / full) | tokens equal plain's |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for i, name in enumerate(names):
        ms = [arm.decode_s[i] * 1e3 / max(1, len(arm.token_ids[i]) - 1) for arm in (on, off)]
        forwards = [a.num_forwards[i] for a in (on, off)]  # type: ignore[index]
        tpf = [
            (len(a.token_ids[i]) - 1) / max(1, f) for a, f in zip((on, off), forwards, strict=True)
        ]
        equal = on.token_ids[i] == plain.token_ids[i] == off.token_ids[i]
        print(f"| {name} | {ms[0]:.1f} | {ms[1]:.1f} | **{ms[1] / ms[0]:.2f}** | "
              f"{tpf[0]:.2f} / {tpf[1]:.2f} | {'yes' if equal else 'NO'} |")  # fmt: skip

    print(
        "| text | draft forward + head ms, screened | full | full / screened "
        "| screened top = full top | largest prob. difference | stop decisions differing |"
    )
    print("|---|---|---|---|---|---|---|")
    for i, name in enumerate(names):
        ids = prompts[i] + plain.token_ids[i]
        cache = SingleSequenceCache(dm, len(ids) + 2)
        cache.forward(ids)
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(20):
            for on_ in (True, False):
                times[on_].append(forward_ms(dm, cache, len(ids), on_, vocab))
        a, b = statistics.median(times[True]), statistics.median(times[False])
        same, n, worst, flips = head_both_ways(dm, hs, ids, vocab)
        print(f"| {name} ({n} positions) | {a:.2f} | {b:.2f} | **{b / a:.2f}** | {same}/{n} | "
              f"{worst:.3f} | {flips} |")  # fmt: skip


if __name__ == "__main__":
    main()
