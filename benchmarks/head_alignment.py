"""Does a served EAGLE-3 head accept what it learned? Its live acceptance on its own training
prompts beside its teacher-forced accuracy on the same sequences.

For ``--sequences`` generated training sequences of the work folder (held-out ones skipped),
the head's step-0 accuracy from the recorded hidden states (the training objective, as the
trainer scores it) and the acceptance of its first draft token when the target, served with
the head at k = 1, writes the same reply again (greedy; the reply is checked). The two agree
when serving hands the head the hidden states training recorded; a head whose live
acceptance on the benchmark suites is far below both has met prompts unlike its training
data instead.

    python benchmarks/head_alignment.py --head qwen-eagle-a
    python benchmarks/head_alignment.py --head HEAD --work DIR --sequences 8

The target is loaded in its served format (the default: gguf blocks, bf16).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--head", required=True, help="head directory or name under the heads cache")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="the head's target")
    ap.add_argument(
        "--work", type=Path, help="train-draft's work folder (default: the built-in one)"
    )
    ap.add_argument("--sequences", type=int, default=6)
    args = ap.parse_args()

    from specserve.config import EngineConfig, ModelConfig, SpecConfig
    from specserve.engine.builder import build_engine
    from specserve.loading.quant_cache import load_in_format
    from specserve.loading.spec_heads import heads_dir, load_eagle3, read_head_info, resolve_head
    from specserve.sampling_params import SamplingParams
    from specserve.train.generate import load_sequences
    from specserve.train.objectives import eagle3_loss, target_to_draft_map
    from specserve.train.run import EVAL_EVERY, TrainDraftOptions

    target = load_in_format(args.model, "gguf", torch.bfloat16)
    arch = target.arch
    head = load_eagle3(read_head_info(resolve_head(args.head)), arch, torch.float32)
    # train-draft's default work folder for the built-in data, beside the heads
    work = args.work or TrainDraftOptions(args.model, "eagle", heads_dir() / "head").work_dir
    seqs = load_sequences(work)
    picks = [s for i, s in enumerate(seqs) if i % EVAL_EVERY and s.targets is None]
    picks = picks[: args.sequences]
    if not picks:
        raise SystemExit(f"no generated training sequence in {work}")
    vocab = head.target_ids(torch.arange(head.cfg.draft_vocab_size))
    t2d = target_to_draft_map(vocab, arch.vocab_size)
    h = arch.hidden_size

    engine = build_engine(
        EngineConfig(
            model=ModelConfig(args.model, dtype="bfloat16"),
            spec=SpecConfig(method="eagle", draft_model=args.head, num_speculative_tokens=1),
        )
    )
    print(
        "| sequence | reply tokens | teacher-forced accuracy | live acceptance (k = 1) "
        "| same reply |"
    )
    print("|---|---|---|---|---|")
    totals = [0, 0, 0, 0]
    for s in picks:
        with torch.no_grad():
            _, scores = eagle3_loss(
                head, target.model.model.embed_tokens, s.tokens, s.hidden[:, : 3 * h].float(),
                s.prompt_len, t2d, 1,
            )  # fmt: skip
        before = engine.stats().spec
        reply = s.tokens[s.prompt_len :].tolist()
        engine.add_request(
            s.id, s.tokens[: s.prompt_len].tolist(),
            SamplingParams(temperature=0.0, max_tokens=len(reply)),
        )  # fmt: skip
        out: list[int] = []
        while engine.has_unfinished_requests():
            for o in engine.step():
                out += o.new_token_ids
        after = engine.stats().spec
        drafted = after.num_draft_tokens - before.num_draft_tokens
        accepted = after.num_accepted_tokens - before.num_accepted_tokens
        totals = [totals[0] + scores.hits[0], totals[1] + scores.scored[0],
                  totals[2] + accepted, totals[3] + drafted]  # fmt: skip
        print(
            f"| {s.id} | {len(reply)} | {scores.hits[0] / max(1, scores.scored[0]):.3f} | "
            f"{accepted / max(1, drafted):.3f} | {'yes' if out == reply else 'no'} |"
        )
    print(
        f"| all | | {totals[0] / max(1, totals[1]):.3f} | {totals[2] / max(1, totals[3]):.3f} | |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
