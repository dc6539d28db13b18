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
    k: int
    draft_s: float
    verify_s: float
    catch_up: int
    tokens: int = 0  # committed by the step

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
        k = stats.k_chosen[0] if stats.k_chosen else -1  # -1: a prompt step, no decode
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


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--suite", default="open-ended", help="a registry suite (bench/suites)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--limit", type=int, default=0, help="only the first N prompts (0: all)")
    p.add_argument("serve_flags", nargs=argparse.REMAINDER, help="-- then specserve serve flags")
    args = p.parse_args()
    flags = [f for f in args.serve_flags if f != "--"]
    serve_args = build_parser().parse_args(["serve", *flags])
    tokenizer = load_tokenizer(serve_args.model)
    prompts = list(get_suite(args.suite))[: args.limit or None]
    recorder = Recorder(build_engine(engine_config_from_args(serve_args)))
    warm = tokenizer.encode_chat([{"role": "user", "content": prompts[0].text}])
    recorder.decode("warm-up", warm, 8)
    print(f"serve flags: {' '.join(flags)}; suite {args.suite}, max_tokens {args.max_tokens}")
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
