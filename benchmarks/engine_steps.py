"""Where a speculative engine's decode time goes, step by step, on one suite (batch 1).

The engine ``specserve serve`` would build from the same flags (after ``--``) decodes each
prompt of a registry suite (chat-templated, greedy) alone, in this process. For every step it
records the k the controller chose, the propose and verify times, the tokens the step
committed and, with a draft model, how many committed tokens the draft had to catch up before
drafting (``DraftModelProposer.last_catch_up_tokens``: 1-2 after a drafting step, more after
a run of k = 0 steps). It prints, per prompt, the steps and TPOT, and for the whole suite the
time of three kinds of decode step side by side:

- **plain**: k = 0 (the yardstick: what the baseline server's steps cost);
- **drafting, steady**: k > 0 with a catch-up of at most 2 tokens;
- **drafting after plain steps**: k > 0 whose draft first caught up over more tokens (a
  controller's probe, or drafting that resumed), with the mean catch-up.

Each kind's share of the decode time and its tokens per step say which one costs the
speculative engine its time against plain decoding::

    .venv/bin/python benchmarks/engine_steps.py --suite open-ended -- \\
        --model qwen2.5-coder-1.5b-instruct --draft-model qwen2.5-coder-0.5b-instruct

With ``--concurrency N`` (N > 1) it keeps N requests in flight instead (a new one joins as
one finishes, the suite's prompts in turn, ``--requests`` in all), as a server at that load
would batch them, and prints the steps by batch size: plain steps (no request drafted) and
drafting steps (at least one did), with the tokens per step and the time per token each
costs, the steps that ran a prompt, the tokens per second over the run, and the k
controller's measured step time per step size (the tokens its forward ran). Run it once with
``--spec-method none`` for the baseline's steps::

    .venv/bin/python benchmarks/engine_steps.py --suite structured --concurrency 4 \\
        --requests 16 -- --model qwen2.5-coder-1.5b-instruct --weights bf16 \\
        --draft-model qwen2.5-coder-0.5b-instruct --draft-weights int4 --max-num-seqs 4

Loads the pair once; run it alone on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

from specserve.bench.suites import get_suite
from specserve.cli import build_parser
from specserve.commands.serve import engine_config_from_args
from specserve.engine.builder import build_engine
from specserve.loading import load_tokenizer
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.proposer import CATCH_UP_STEADY


@dataclass
class Step:
    k: int  # the largest k of the step's requests (-1: no request decoded)
    draft_s: float
    verify_s: float
    catch_up: int
    tokens: int = 0  # committed by the step
    batch: int = 1  # decoding requests (set by decode_concurrently)
    prompt: bool = False  # it ran (a chunk of) a prompt (set by decode_concurrently)

    @property
    def kind(self) -> str:
        if self.k == 0:
            return "plain"
        return "drafting, steady" if self.catch_up <= CATCH_UP_STEADY else "drafting after plain"


class Recorder:
    """The engine's steps, as its step listener sees them (one listener for the process)."""

    def __init__(self, engine) -> None:  # type: ignore[no-untyped-def]
        self.engine = engine
        self.steps: list[Step] = []
        engine.add_step_listener(self._listen)

    def _listen(self, stats) -> None:  # type: ignore[no-untyped-def]
        k = max(stats.k_chosen) if stats.k_chosen else -1  # -1: a prompt step, no decode
        proposer = self.engine.proposer
        catch_up = getattr(proposer, "last_catch_up_tokens", 0) if k > 0 else 0
        self.steps.append(Step(k, stats.draft_s, stats.verify_s, catch_up))

    def decode(self, request_id: str, ids: list[int], max_tokens: int) -> tuple[list[Step], float]:
        """One prompt to the end: its decode steps (the first, which carries the prompt and
        the first token, left out) and its TPOT in seconds."""
        self.steps = []
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        self.engine.add_request(request_id, ids, params)
        tokens, first, last = 0, 0.0, 0.0
        while self.engine.has_unfinished_requests():
            new = sum(len(o.new_token_ids) for o in self.engine.step())
            now = time.perf_counter()
            if self.steps:
                self.steps[-1].tokens = new
            if new:
                first, last = first or now, now
            tokens += new
        return self.steps[1:], (last - first) / max(tokens - 1, 1)

    def decode_concurrently(
        self, prompts: list[list[int]], concurrency: int, num_requests: int, max_tokens: int
    ) -> tuple[list[Step], int, float]:
        """``num_requests`` requests over ``prompts`` in turn, ``concurrency`` in flight: the
        steps, the tokens committed and the seconds the run took."""
        self.steps = []
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        added = tokens = 0
        t0 = time.perf_counter()
        while added < num_requests or self.engine.has_unfinished_requests():
            sched = self.engine.scheduler
            while added < num_requests and len(sched.running) + len(sched.waiting) < concurrency:
                self.engine.add_request(f"c{added}", prompts[added % len(prompts)], params)
                added += 1
            decoding = sum(r.is_decoding for r in sched.running)
            prompts_run = len(sched.waiting) + len(sched.running) - decoding
            new = sum(len(o.new_token_ids) for o in self.engine.step())
            if self.steps:
                last = self.steps[-1]
                last.tokens, last.batch, last.prompt = new, decoding, prompts_run > 0
            tokens += new
        return self.steps, tokens, time.perf_counter() - t0


def print_by_batch(steps: list[Step], tokens: int, seconds: float, controller) -> None:  # type: ignore[no-untyped-def]
    """The steps of a run at a concurrency, by batch size and kind (module docstring)."""
    total = sum(s.draft_s + s.verify_s for s in steps)
    print(f"{tokens} tokens in {seconds:.1f} s: {tokens / seconds:.2f} tok/s")
    print()
    print("| batch | step kind | steps | ms per step (draft + verify) | tokens per step | "
          "ms per token | share of the steps' time |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    groups: dict[tuple[int, str], list[Step]] = {}
    for s in steps:
        kind = "prompt" if s.prompt else ("plain" if s.k <= 0 else "drafting")
        groups.setdefault((0 if s.prompt else s.batch, kind), []).append(s)
    for (batch, kind), group in sorted(groups.items()):
        draft = 1e3 * statistics.mean(s.draft_s for s in group)
        verify = 1e3 * statistics.mean(s.verify_s for s in group)
        per_step = statistics.mean(s.tokens for s in group)
        per_token = f"{(draft + verify) / per_step:.1f}" if per_step else "-"
        share = sum(s.draft_s + s.verify_s for s in group) / total
        print(
            f"| {batch or 'any'} | {kind} | {len(group)} | {draft + verify:.1f} ({draft:.1f} + "
            f"{verify:.1f}) | {per_step:.2f} | {per_token} | {100 * share:.0f} % |"
        )
    if controller is not None:
        sizes = controller.costs.measured_by_size()
        print()
        print("k controller's step time by step size (tokens the forward ran), ms:")
        print(", ".join(f"{n}: {1e3 * t:.0f}" for n, t in sorted(sizes.items())))


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--suite", default="open-ended", help="a registry suite (bench/suites)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--limit", type=int, default=0, help="only the first N prompts (0: all)")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight (module doc)")
    p.add_argument("--requests", type=int, default=16, help="requests in all, with --concurrency")
    p.add_argument("serve_flags", nargs=argparse.REMAINDER, help="-- then specserve serve flags")
    args = p.parse_args()
    if args.concurrency < 1 or args.requests < 1:
        p.error("--concurrency and --requests must be >= 1")
    flags = [f for f in args.serve_flags if f != "--"]
    serve_args = build_parser().parse_args(["serve", *flags])
    tokenizer = load_tokenizer(serve_args.model)
    prompts = list(get_suite(args.suite))[: args.limit or None]
    recorder = Recorder(build_engine(engine_config_from_args(serve_args)))
    warm = tokenizer.encode_chat([{"role": "user", "content": prompts[0].text}])
    recorder.decode("warm-up", warm, 8)
    print(f"serve flags: {' '.join(flags)}; suite {args.suite}, max_tokens {args.max_tokens}")
    if args.concurrency > 1:
        ids = [tokenizer.encode_chat([{"role": "user", "content": q.text}]) for q in prompts]
        print(f"concurrency {args.concurrency}, {args.requests} requests")
        run = recorder.decode_concurrently(ids, args.concurrency, args.requests, args.max_tokens)
        print_by_batch(*run, recorder.engine.k_controller)
        return 0
    print("| prompt | steps | k = 0 steps | drafting steps | tokens | TPOT ms |")
    print("|---|---|---|---|---|---|")
    every: list[Step] = []
    for n, prompt in enumerate(prompts):
        ids = tokenizer.encode_chat([{"role": "user", "content": prompt.text}])
        decode_steps, tpot = recorder.decode(f"p{n}", ids, args.max_tokens)
        every += decode_steps
        plain = sum(s.k == 0 for s in decode_steps)
        print(
            f"| {prompt.id} | {len(decode_steps)} | {plain} | {len(decode_steps) - plain} | "
            f"{sum(s.tokens for s in decode_steps)} | {1e3 * tpot:.1f} |",
            flush=True,
        )
    total = sum(s.draft_s + s.verify_s for s in every)
    print()
    print("| step kind | steps | ms per step (draft + verify) | tokens per step | "
          "ms per token | share of decode time | mean catch-up |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for kind in ("plain", "drafting, steady", "drafting after plain"):
        group = [s for s in every if s.kind == kind]
        if not group:
            print(f"| {kind} | 0 | | | | | |")
            continue
        draft = 1e3 * statistics.mean(s.draft_s for s in group)
        verify = 1e3 * statistics.mean(s.verify_s for s in group)
        tokens = statistics.mean(s.tokens for s in group)
        share = sum(s.draft_s + s.verify_s for s in group) / total
        catch_up = statistics.mean(s.catch_up for s in group)
        print(
            f"| {kind} | {len(group)} | {draft + verify:.1f} ({draft:.1f} + {verify:.1f}) | "
            f"{tokens:.2f} | {(draft + verify) / tokens:.1f} | {100 * share:.0f} % | "
            f"{catch_up:.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
