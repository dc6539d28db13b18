"""Adaptive k vs every fixed k on the same texts: record greedy traces once, replay policies.

A live benchmark (benchmarks/speculative_batch1.py) compares arms whose bf16 texts can differ
after a near-tie, so a policy can look better or worse only because it decoded an easier or
harder text. This command removes that: for each prompt it decodes the target's plain greedy text,
then asks the draft, at every position of that text, for its k_max-token greedy draft and
records how many tokens match (the *run length*) and the draft's top probability for each of
its tokens (which replays the draft model's confidence stop). It also measures the step costs
(target forward over 1..k_max + 1 tokens, draft propose time, and the draft's catch-up per
token when it drafts after 16 plain steps, which the replay charges to every drafting step
after k = 0 steps, probes included). Replaying a policy on the runs with
those costs (specserve.spec_decode.replay) gives its decode time on exactly the text plain decoding
produced. The adaptive controller is replayed over the prompts in order with one shared
controller, as a server would see them.

    python benchmarks/k_replay.py --draft-weights int4 --output traces.json   # record
    python benchmarks/k_replay.py --traces traces.json                         # replay only
    python benchmarks/k_replay.py --traces traces.json --thresholds 0,0.3,0.5  # confidence stop
    python benchmarks/k_replay.py --traces traces.json --cold   # no step times at start
    python benchmarks/k_replay.py --traces traces.json --per-prompt [--cold]

The adaptive controller starts with the recorded step times, as a server's does
(``spec_decode/warm_start.py``); ``--cold`` replays it without them. ``--per-prompt`` gives
each prompt a new controller, as ``specserve perf``'s adaptive arms decode each prompt.

Recording loads two models (a few minutes on 2 cores): run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from typing import Any

from specserve.bench.suites import get_suite
from specserve.config import WEIGHT_FORMATS
from specserve.dtypes import torch_dtype
from specserve.spec_decode import warm_start
from specserve.spec_decode.factory import make_proposer
from specserve.spec_decode.k_controller import KController
from specserve.spec_decode.proposer import CATCH_UP_STEADY
from specserve.spec_decode.replay import StepCosts, common_prefix, replay

SUITES = ("mini-structured", "mini-open-ended")  # the live benchmark's registry suites
CATCH_UP_GAP = 16  # committed tokens a timed catch-up covers (a probe after 16 plain steps)


def record(args: argparse.Namespace) -> dict[str, Any]:
    from specserve.kv_cache.single_sequence import SingleSequenceCache
    from specserve.loading.quant_cache import load_in_format
    from specserve.sampling_params import SamplingParams
    from specserve.spec_decode.plain_loop import generate_plain
    from specserve.spec_decode.proposer import ProposeInput

    dtype = torch_dtype(args.dtype)
    target = load_in_format(args.target, args.weights, dtype)
    draft = load_in_format(args.draft, args.draft_weights, dtype).model
    from specserve.models.native import fused_layer

    fused_layer.set_draft(draft)  # the draft's kernels as the server runs them (engine builder)
    tok = target.tokenizer
    eos = tuple(tok.eos_token_ids)
    params = SamplingParams(max_tokens=args.max_tokens)
    proposer = make_proposer("draft", target.arch.vocab_size, draft, max_model_len=2048)
    kmax = args.k_max

    traces: dict[str, dict[str, Any]] = {}
    propose_s: dict[int, list[float]] = {1: [], kmax: []}
    catch_up_s: list[float] = []  # per token, over a gap of CATCH_UP_GAP committed tokens
    for suite in args.suites.split(","):
        traces[suite] = {}
        for prompt in get_suite(suite):
            name = prompt.id
            text = tok.apply_chat_template([{"role": "user", "content": prompt.text}])
            ids = list(tok.encode(text, add_special_tokens=False))
            tokens = generate_plain(target.model, ids, params, eos).token_ids
            rid = f"trace-{name}"
            proposer.prefill(rid, ids)  # type: ignore[attr-defined]
            runs, confs = [], []
            for p in range(len(tokens) - 1):
                committed = ids + tokens[: p + 1]
                # Alternate a 1-token propose (timing only) with the k_max one we record.
                if p % 4 == 0:
                    t0 = time.perf_counter()
                    proposer.propose([ProposeInput(rid, committed, 1, params)])
                    propose_s[1].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                draft_ids = proposer.propose([ProposeInput(rid, committed, kmax, params)])[0]
                propose_s[kmax].append(time.perf_counter() - t0)
                runs.append(common_prefix(draft_ids.draft_token_ids, tokens[p + 1 :]))
                confs.append([round(c, 4) for c in proposer.last_confidences[0]])  # type: ignore[attr-defined]
            if len(tokens) > CATCH_UP_GAP + 1:  # a 1-token propose after k = 0 steps
                proposer.release(rid)
                proposer.prefill(rid, ids)  # type: ignore[attr-defined]
                proposer.propose([ProposeInput(rid, ids + tokens[:1], 1, params)])
                t0 = time.perf_counter()
                proposer.propose([ProposeInput(rid, ids + tokens[: CATCH_UP_GAP + 1], 1, params)])
                catch_up_s.append(time.perf_counter() - t0)
            proposer.release(rid)
            traces[suite][name] = {"tokens": tokens, "runs": runs, "confidences": confs}
            print(f"{suite:15s} {name:13s} n={len(tokens)} runs={runs}", flush=True)

    # Target forward over t tokens at a realistic context length, t = 1 .. k_max + 1.
    ids = list(tok.encode("def f(x):\n    return x * 2\n" * 12, add_special_tokens=False))
    cache = SingleSequenceCache(target.model, len(ids) + kmax + 8)
    cache.forward(ids)
    verify = []
    for t in range(1, kmax + 2):
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            hidden = cache.forward(ids[:t])
            target.model.compute_logits(hidden)
            times.append(time.perf_counter() - t0)
            cache.truncate(len(ids))
        verify.append(statistics.median(times))
    p1, pk = statistics.median(propose_s[1]), statistics.median(propose_s[kmax])
    per_token = max(0.0, (pk - p1) / (kmax - 1))
    # A 1-token propose that first catches up CATCH_UP_GAP tokens, less a steady one, spread
    # over the tokens beyond the steady catch-up.
    extra = statistics.median(catch_up_s) - p1 if catch_up_s else 0.0
    costs = {
        "verify_s": verify,
        "draft_base_s": max(0.0, p1 - per_token),
        "draft_token_s": per_token,
        "catch_up_token_s": max(0.0, extra / (CATCH_UP_GAP - CATCH_UP_STEADY)),
    }
    return {"args": vars(args), "costs": costs, "traces": traces}


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def replay_all(
    data: dict[str, Any],
    k_max: int,
    controller_kwargs: dict[str, Any],
    threshold: float = 0.0,
    catch_up_ms: float | None = None,
    cold: bool = False,
    per_prompt: bool = False,
) -> dict[str, tuple[float, float]]:
    """Print the per-prompt table for one confidence threshold; returns, per suite, the
    geomean speedup of the adaptive controller and of the best fixed k. The controller
    starts with the recorded step times (``spec_decode/warm_start.py``), or with ``cold``
    with none; one controller for all prompts, or with ``per_prompt`` a new one for each."""
    c = data["costs"]
    # A forward over more tokens never takes less time; the recorded medians can dip (timing
    # noise), which would hand small fixed k a verify cheaper than a plain step.
    verify = [max(c["verify_s"][: t + 1]) for t in range(k_max + 1)]
    catch_up = c.get("catch_up_token_s", 0.0) if catch_up_ms is None else catch_up_ms / 1000
    costs = StepCosts(tuple(verify), c["draft_base_s"], c["draft_token_s"], catch_up)
    print(
        "costs: verify "
        + " ".join(f"{1000 * v:.0f}" for v in costs.verify_s)
        + f" ms (1..{k_max + 1} tokens); draft {1000 * costs.draft_base_s:.1f} ms + "
        f"{1000 * costs.draft_token_s:.1f} ms per token, catch-up "
        f"{1000 * costs.catch_up_token_s:.1f} ms per token after k = 0 steps"
    )

    def new_controller() -> KController:
        controller = KController(k_max, confidence_stop=threshold > 0, **controller_kwargs)
        if not cold:  # as a server starts: the target's step times measured at start
            warm_start.seed(controller, costs.verify_s)
        return controller

    controller = new_controller()
    fixed = list(range(1, k_max + 1))
    summary: dict[str, tuple[float, float]] = {}
    print(f"\nconfidence threshold {threshold:g}")
    print(
        f"| suite | prompt | plain TPOT ms | best fixed k | {' | '.join(map(str, fixed))} |"
        " adaptive | adaptive / best | mean k |"
    )
    print("|---|---|---|---|" + "---|" * len(fixed) + "---|---|---|")
    for suite, prompts in data["traces"].items():
        speed: dict[Any, list[float]] = {k: [] for k in [*fixed, "auto"]}
        for name, tr in prompts.items():
            runs = tr["runs"]
            conf = tr.get("confidences") if threshold > 0 else None
            if threshold > 0 and conf is None:
                raise SystemExit("these traces have no draft confidences: record them again")
            base = replay(runs, 0, costs).tpot_s
            row = {
                k: base / replay(runs, k, costs, confidences=conf, threshold=threshold).tpot_s
                for k in fixed
            }
            if per_prompt:
                controller = new_controller()
            auto = replay(
                runs, controller, costs, f"{suite}-{name}", confidences=conf, threshold=threshold
            )
            row_auto = base / auto.tpot_s
            best = max(fixed, key=lambda k: row[k])
            mean_k = sum(auto.k_history) / len(auto.k_history)
            cells = " | ".join(f"{row[k]:.2f}" for k in fixed)
            print(
                f"| {suite} | {name} | {1000 * base:.0f} | {best} | {cells} | {row_auto:.2f} | "
                f"{row_auto / row[best]:.3f} | {mean_k:.1f} |"
            )
            for k in fixed:
                speed[k].append(row[k])
            speed["auto"].append(row_auto)
        suite_fixed = {k: geomean(speed[k]) for k in fixed}
        best = max(fixed, key=lambda k: suite_fixed[k])
        auto_g = geomean(speed["auto"])
        print(
            f"| **{suite}** | geomean | | {best} | "
            + " | ".join(f"{suite_fixed[k]:.2f}" for k in fixed)
            + f" | {auto_g:.2f} | {auto_g / suite_fixed[best]:.3f} | |"
        )
        summary[suite] = (auto_g, suite_fixed[best])
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", help="replay these recorded traces instead of recording")
    ap.add_argument("--output", help="write the recorded traces and costs here")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument(
        "--weights", choices=WEIGHT_FORMATS, help="the target's weight format (default: as stored)"
    )
    ap.add_argument("--draft-weights", choices=WEIGHT_FORMATS, default="int4")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k-max", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5, help="timed forwards per step size")
    ap.add_argument(
        "--thresholds",
        default="0",
        help="comma-separated draft confidence thresholds to replay (0: no confidence stop)",
    )
    ap.add_argument("--suites", default=",".join(SUITES), help="comma-separated registry suites")
    ap.add_argument(
        "--catch-up-ms",
        type=float,
        help="a draft's catch-up per committed token after k = 0 steps (default: as recorded; "
        "0 for traces recorded without it)",
    )
    ap.add_argument(
        "--cold",
        action="store_true",
        help="replay a controller that starts with no step times (before the warm start)",
    )
    ap.add_argument(
        "--per-prompt",
        action="store_true",
        help="a new controller for each prompt (as specserve perf's adaptive arms decode)",
    )
    args = ap.parse_args()
    if args.traces:
        with open(args.traces) as f:
            data = json.load(f)
    else:
        data = record(args)
        if args.output:
            with open(args.output, "w") as f:
                json.dump(data, f)
    k_max = min(args.k_max, len(data["costs"]["verify_s"]) - 1)
    thresholds = [float(t) for t in args.thresholds.split(",")]
    results = {
        t: replay_all(data, k_max, {}, t, args.catch_up_ms, args.cold, args.per_prompt)
        for t in thresholds
    }
    if len(thresholds) > 1:
        print("\n| confidence threshold | " + " | ".join(data["traces"]) + " |")
        print("|---|" + "---|" * len(data["traces"]))
        for t, by_suite in results.items():
            cells = [f"adaptive {a:.2f}, best fixed {b:.2f}" for a, b in by_suite.values()]
            print(f"| {t:g} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
