"""``specserve train-draft``: train an EAGLE-3 head or Medusa heads for a target on CPU.

The target writes its own replies to the training prompts at temperature 0 (self-
distillation), the hidden states the head reads are recorded by the same forwards (a given
reply, ``--text-prompts`` or ``--replies given``, is read in one prefill instead and labelled
with the target's own next tokens), and the head is trained with checkpoints and resume; the
result is a head directory that ``serve --spec-method eagle|medusa --draft-model DIR`` loads,
and vLLM too (``speculators`` EAGLE-3 format, vLLM's Medusa format). Without ``--output`` the
head is kept by name under the cache (``specserve models list`` shows it; ``--draft-model
NAME`` finds it).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from specserve.config import WEIGHT_FORMATS

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train-draft",
        help="train an EAGLE-3 or Medusa draft head for a target (self-distillation, CPU)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default=DEFAULT_TARGET, help="the target: catalog name, GGUF, HF dir")
    p.add_argument("--method", required=True, choices=["eagle", "medusa"])
    p.add_argument(
        "--data",
        type=Path,
        help="training JSONL: {prompt}, {messages} (OpenAI chat) or {conversations} (ShareGPT) "
        "per line; default: prompts built from the Python standard library's sources",
    )
    p.add_argument(
        "--replies",
        choices=["generate", "given"],
        default="generate",
        help="--data's replies: the target generates them (self-distillation), or each "
        "conversation's assistant reply after its last user turn is read as given, in one "
        "prefill, labelled with the target's own next tokens",
    )
    p.add_argument(
        "--num-prompts", type=int, default=64, help="built-in prompts to use (the target replies)"
    )
    p.add_argument(
        "--text-prompts",
        type=int,
        default=0,
        help="built-in conversations with given replies (the standard library's documentation "
        "topics and function sources), added to the data",
    )
    p.add_argument("--max-tokens", type=int, default=160, help="longest generated reply")
    p.add_argument("--output", type=Path, help="head directory to write")
    p.add_argument(
        "--name", help="keep the head under this name in the cache (default: <model>-<method>)"
    )
    p.add_argument(
        "--work", type=Path, help="work directory (default: .<model>.<data>.work beside the head)"
    )
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument(
        "--weights",
        choices=WEIGHT_FORMATS,
        help="the target's weight format (default: as serve picks it, gguf for a quantised "
        "GGUF file unless --dtype float32)",
    )
    p.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        default="bfloat16",
        help="the target's compute dtype while generating (float32: the dequantised float "
        "weights and PyTorch's matmuls, faster for many rows at once on CPUs without AVX-512 "
        "BF16 but about 4 GiB more memory for the 1.5B)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="torch device the target generates on and the head trains on (cpu, cuda, cuda:1)",
    )
    p.add_argument("--max-num-seqs", type=int, default=32, help="replies generated at once")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument(
        "--lr",
        type=float,
        default=None,
        help="peak learning rate (default 5e-4 for eagle, 1e-3 for medusa)",
    )
    p.add_argument("--batch-tokens", type=int, default=512, help="scored tokens per step")
    p.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--ttt-steps", type=int, default=2, help="EAGLE-3 training-time-test steps")
    p.add_argument("--draft-vocab-size", type=int, default=32000, help="EAGLE-3 draft vocabulary")
    p.add_argument("--medusa-heads", type=int, default=4)
    p.add_argument("--medusa-layers", type=int, default=1, help="residual blocks per head")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specserve.loading.spec_heads import heads_dir
    from specserve.train.run import TrainDraftOptions, run_train_draft
    from specserve.train.trainer import CheckpointError, TrainConfig

    try:
        if args.max_tokens < 1 or args.max_num_seqs < 1:
            raise ValueError("--max-tokens and --max-num-seqs must be >= 1")
        if args.num_prompts < 0 or args.text_prompts < 0:
            raise ValueError("--num-prompts and --text-prompts must be >= 0")
        if args.data is None and args.num_prompts + args.text_prompts < 1:
            raise ValueError("no training data: --num-prompts or --text-prompts must be >= 1")
        if args.replies == "given" and args.data is None:
            raise ValueError("--replies given reads --data's replies: give --data")
        if not 1 <= args.ttt_steps <= 8 or not 1 <= args.medusa_heads <= 32:
            raise ValueError("--ttt-steps must be in [1, 8] and --medusa-heads in [1, 32]")
        if args.output is not None and args.name is not None:
            raise ValueError("give --output or --name, not both")
        name = args.name or f"{Path(args.model).name.removesuffix('.gguf')}-{args.method}"
        output = args.output or heads_dir() / name
        lr = args.lr if args.lr is not None else (5e-4 if args.method == "eagle" else 1e-3)
        opts = TrainDraftOptions(
            model=args.model,
            method=args.method,
            output=output,
            data=args.data,
            num_prompts=args.num_prompts,
            replies=args.replies,
            text_prompts=args.text_prompts,
            max_tokens=args.max_tokens,
            weights=args.weights,
            dtype=args.dtype,
            device=args.device,
            work=args.work,
            resume=args.resume,
            max_num_seqs=args.max_num_seqs,
            draft_vocab_size=args.draft_vocab_size,
            ttt_steps=args.ttt_steps,
            medusa_heads=args.medusa_heads,
            medusa_layers=args.medusa_layers,
            train=TrainConfig(
                epochs=args.epochs,
                lr=lr,
                batch_tokens=args.batch_tokens,
                checkpoint_every=args.checkpoint_every,
                seed=args.seed,
            ),
            command="specserve train-draft " + shlex.join(sys.argv[2:]),
        )
        run_train_draft(opts, progress=lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        print("\ninterrupted: finished generations and the last checkpoint are kept; run the "
              "same command with --resume to continue", file=sys.stderr)  # fmt: skip
        return 130
    except (CheckpointError, ValueError, OSError, RuntimeError, MemoryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
