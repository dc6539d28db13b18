"""Engine step cost of speculation at one batch size: plain vs draft-model k = 1, 2, 4.

Runs the in-process engine (no HTTP) on B chat requests at once, once per k, and prints the
median proposer time and target verify time of the steps where all B requests decode, the
tokens committed per step and the resulting tokens/s. It shows where speculation stops
paying as the batch grows (the verify of B × (k + 1) tokens turns compute bound and the
draft's own batched step gets slower), the measurement behind the serving benchmark's
``--speculative-disable-by-batch-size``. Request ``i`` asks prompt ``i`` modulo 8 of the
registry suite ``brief`` (specserve.bench.suites).

    .venv/bin/python benchmarks/batch_cost.py --batch-size 8
"""

from __future__ import annotations

import argparse
import statistics
import time

from specserve.bench.suites import get_suite
from specserve.config import WEIGHT_FORMATS, EngineConfig, ModelConfig, SchedulerConfig, SpecConfig
from specserve.engine.builder import build_engine
from specserve.engine.outputs import StepStats
from specserve.sampling_params import SamplingParams

PROMPT_SUITE = "brief"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--draft-weights", default="int4", choices=WEIGHT_FORMATS)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--ks", default="0,1,2,4", help="comma list of fixed k (0 = plain)")
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()
    questions = [p.text for p in get_suite(PROMPT_SUITE)]
    model = ModelConfig(model=args.target, dtype="bfloat16")
    for k in (int(x) for x in args.ks.split(",")):
        spec = (
            SpecConfig(
                method="draft",
                draft_model=args.draft,
                num_speculative_tokens=k,
                draft_weights=args.draft_weights,
            )
            if k
            else SpecConfig()
        )
        sched = SchedulerConfig(max_num_seqs=args.batch_size)
        engine = build_engine(EngineConfig(model=model, spec=spec, scheduler=sched))
        stats: list[StepStats] = []
        engine.add_step_listener(stats.append)
        tok = engine.tokenizer
        assert tok is not None
        for i in range(args.batch_size):
            question = questions[i % len(questions)]
            text = tok.apply_chat_template([{"role": "user", "content": question}])
            ids = list(tok.encode(text, add_special_tokens=False))
            engine.add_request(
                f"r{i}", ids, SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
            )
        t0 = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        wall = time.perf_counter() - t0
        # Steps where every request decodes; the first two still warm kernels up.
        steps = [s for s in stats if s.num_prompt_tokens == 0 and s.num_running == args.batch_size]
        steps = steps[2:]
        if not steps:
            print(f"B={args.batch_size} k={k}: too few full decode steps; raise --max-tokens")
            continue
        draft_ms = statistics.median(s.draft_s for s in steps) * 1000
        verify_ms = statistics.median(s.verify_s for s in steps) * 1000
        per_step = statistics.mean(s.num_generation_tokens for s in steps)
        rate = per_step / ((draft_ms + verify_ms) / 1000)
        print(
            f"B={args.batch_size} k={k}: {len(steps)} steps, draft {draft_ms:.0f} ms, verify "
            f"{verify_ms:.0f} ms, {per_step:.1f} tokens/step -> {rate:.1f} tok/s "
            f"(wall {wall:.1f} s)",
            flush=True,
        )
        del engine
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
