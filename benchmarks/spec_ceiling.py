"""The most draft speculation can give beside llama.cpp plain: every draft accepted.

A step of draft speculation at depth k whose drafts are all accepted costs one 2-token draft
forward (the previous step's last draft and its bonus token), k - 1 one-token draft forwards
and one target forward over k + 1 tokens, and yields k + 1 tokens. This measures those
forwards for serve's default pair on the GGUF file (the target in the ``gguf`` format, the
draft in the format ``serve`` picks beside it, x in int8 for its one-row int4 calls where
serve does that, its greedy LM head screened where serve screens it) and llama.cpp's plain
decode of the same file, alternated round by round in
one process, at the context of a real prompt and its first tokens. It prints, per k, the ms
per token at full acceptance and that rate against llama.cpp plain: **the ceiling of any
draft-model arm of** ``specserve perf`` **at that k** (a run accepts less than everything, so
its tokens per forward fall below k + 1 and its ratio below this). It also prints the one-token
step against llama.cpp's plain token, the plain arm's ratio.

    python benchmarks/spec_ceiling.py --llama-python "$LLAMA_VENV/bin/python" --rounds 10

Run it alone on the machine: it measures time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specserve.bench.suites import get_prompts
from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.loading import CATALOG
from specserve.loading.transport import fetch
from specserve.models.decoder import DecoderLM
from specserve.models.native import fused_layer, head_screen
from specserve.perf.main import load_gguf_pair
from specserve.perf.options import PROMPT_SUITE
from specserve.perf.worker_arms import start_llamacpp

MAX_K = 8


def _forward_ms(
    model: DecoderLM, cache: SingleSequenceCache, base: int, ids: list[int], last_only: bool
) -> float:
    """One forward of ``ids`` after the first ``base`` cached tokens, in ms, with the logits of
    every row (as a verify computes them) or, as a greedy draft forward does, the top token
    of the last (through the screened head where the draft has one: head_screen.py)."""
    cache.truncate(base)
    t0 = time.perf_counter()
    hidden = cache.forward(ids)
    screen = head_screen.for_head(model.lm_head) if last_only else None
    if screen is not None:
        head_screen.greedy(hidden[-1:], screen, model.cfg.vocab_size)
    else:
        model.compute_logits(hidden[-1:] if last_only else hidden)
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama-python", required=True, help="interpreter with llama_cpp")
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--prompt", default="cat", help="a prompt id of perf's suite")
    p.add_argument("--tokens", type=int, default=48, help="llama.cpp's decode per round")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--speedup", type=float, default=2.0, help="a target ratio to size")
    args = p.parse_args()
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)

    target, draft, draft_fmt = load_gguf_pair(args.target, args.draft)
    text = get_prompts(PROMPT_SUITE, [args.prompt])[0].text
    prompt = target.tokenizer.encode_chat([{"role": "user", "content": text}])
    eos = list(target.tokenizer.eos_token_ids)

    worker = start_llamacpp(args.llama_python, fetch(CATALOG[args.target]), threads)
    try:
        req = {"op": "decode", "mode": "plain", "prompt": prompt, "eos": eos}
        first = worker.request({**req, "max_tokens": args.tokens})["token_ids"]
        # our forwards run at the context of the prompt and llama.cpp's first tokens (greedy,
        # the text both decode), ahead of them the tokens it went on with
        base = len(prompt) + len(first) // 2
        ids = prompt + first
        ahead = (ids[base:] + [first[-1]] * (MAX_K + 1))[: MAX_K + 1]
        t_cache = SingleSequenceCache(target.model, base + MAX_K + 2)
        d_cache = SingleSequenceCache(draft.model, base + 3)
        t_cache.forward(ids[:base])
        d_cache.forward(ids[:base])
        llama: list[float] = []
        verify: dict[int, list[float]] = {t: [] for t in range(1, MAX_K + 2)}
        one: list[float] = []
        two: list[float] = []
        for _ in range(args.rounds):
            rec = worker.request({**req, "max_tokens": args.tokens})
            llama.append(rec["decode_s"] * 1e3 / max(1, len(rec["token_ids"]) - 1))
            # the first forward after the other process ran is slow (threads woken, caches
            # cold): one of each model, not counted
            _forward_ms(target.model, t_cache, base, ahead[:1], False)
            _forward_ms(draft.model, d_cache, base, ahead[:1], True)
            for t in verify:
                verify[t].append(_forward_ms(target.model, t_cache, base, ahead[:t], False))
            for _ in range(4):
                one.append(_forward_ms(draft.model, d_cache, base, ahead[:1], True))
                two.append(_forward_ms(draft.model, d_cache, base, ahead[:2], True))
    finally:
        worker.close()

    med = statistics.median
    ll, d1, d2 = med(llama), med(one), med(two)
    v = {t: med(x) for t, x in verify.items()}
    print(
        f"{args.target} gguf, draft {args.draft} {draft_fmt} ({fused_layer.describe(draft.model)}),"
        f" prompt {args.prompt!r}, context {base} tokens, {args.rounds} rounds, medians"
    )
    print(
        f"llama.cpp plain {ll:.1f} ms a token; our one-token step {v[1]:.1f} ms "
        f"(plain against llama.cpp plain {ll / v[1]:.2f}x); draft forward 1 token {d1:.1f} ms, "
        f"2 tokens {d2:.1f} ms"
    )
    print(
        "| k | draft ms (2 + (k - 1) x 1 token) | verify ms (k + 1 tokens) "
        "| ms a token, every draft accepted | ceiling x llama.cpp plain |"
    )
    print("|---|---|---|---|---|")
    best = (float("inf"), 0)
    for k in range(1, MAX_K + 1):
        drafting = d2 + (k - 1) * d1
        per_token = (drafting + v[k + 1]) / (k + 1)
        best = min(best, (per_token, k))
        cells = f"{drafting:.1f} | {v[k + 1]:.1f} | {per_token:.1f}"
        print(f"| {k} | {cells} | **{ll / per_token:.2f}** |")
    per_token, k = best
    need = ll / args.speedup
    gap = (
        f"{1 - need / per_token:.0%} less than the best k's {per_token:.1f} ms"
        if per_token > need
        else f"which the best k's {per_token:.1f} ms meets ({1 - per_token / need:.0%} below)"
    )
    print(
        f"best: {ll / per_token:.2f}x llama.cpp plain at k = {k}; {args.speedup:g}x would need "
        f"{need:.1f} ms a token with every draft accepted, {gap}"
    )


if __name__ == "__main__":
    main()
