"""One engine stepped from the thread that built it and from a second thread, alternately.

Builds the engine the given ``specserve serve`` flags describe on the main thread, then
decodes the same request (``--max-tokens`` tokens, greedy, EOS ignored) alternately from the
main thread and from a new ``threading.Thread``, ``--pairs`` times, and prints the median and
mean step time of each. Each thread that runs torch's parallel regions keeps an OpenMP team
of its own; with two teams on a 2-core machine GNU OpenMP throttles its spinning and the
second column comes out slower. ``specserve serve`` therefore loads its models on the thread
that steps them (``AsyncEngine.from_config``). Environment variables of the OpenMP runtime
(``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``) can be set for the whole run.

    .venv/bin/python benchmarks/engine_thread.py -- --model qwen2.5-coder-1.5b-instruct

Heavy (loads the model): run it alone on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from specserve.cli import build_parser
from specserve.commands.serve import engine_config_from_args
from specserve.engine.builder import build_engine
from specserve.engine.llm_engine import LLMEngine
from specserve.sampling_params import SamplingParams

PROMPT = "Write a long story about a cat who learns to code in Python."


def decode(engine: LLMEngine, ids: list[int], max_tokens: int, out: list[float]) -> None:
    """Decode one request to the end; append each step's seconds after the first (prefill)."""
    engine.add_request(
        f"r{time.monotonic_ns()}", list(ids),
        SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )  # fmt: skip
    times = []
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    out.extend(times[1:])


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("serve_flags", nargs=argparse.REMAINDER, help="-- then specserve serve flags")
    args = p.parse_args()
    flags = [f for f in args.serve_flags if f != "--"]
    engine = build_engine(engine_config_from_args(build_parser().parse_args(["serve", *flags])))
    assert engine.tokenizer is not None
    ids = list(engine.tokenizer.encode(PROMPT))
    decode(engine, ids, 8, [])  # warm-up
    print(f"serve flags: {' '.join(flags)}; {args.max_tokens} tokens a request")
    print("| pair | main thread: median / mean ms | second thread: median / mean ms |")
    print("|---|---|---|")
    for pair in range(1, args.pairs + 1):
        main_steps: list[float] = []
        thread_steps: list[float] = []
        decode(engine, ids, args.max_tokens, main_steps)
        worker = threading.Thread(target=decode, args=(engine, ids, args.max_tokens, thread_steps))
        worker.start()
        worker.join()
        cells = [
            f"{statistics.median(s) * 1e3:.1f} / {statistics.fmean(s) * 1e3:.1f}"
            for s in (main_steps, thread_steps)
        ]
        print(f"| {pair} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
