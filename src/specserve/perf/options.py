"""The flags of ``specserve perf`` (no torch here: the CLI builds every parser at start-up)."""

from __future__ import annotations

import argparse
import os
import sys

from specserve.bench.suites import get_suite
from specserve.config import WEIGHT_FORMATS

PROMPT_SUITE = "perf"
"""The registry suite whose prompt ids ``--prompts`` names (specserve.bench.suites)."""


# The arm groups `--arms` takes.
ARM_GROUPS = ("plain", "draft", "ngram", "hybrid", "fused", "transformers", "llamacpp", "vllm")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``specserve perf`` flags to ``p``."""
    prompt_ids = [prompt.id for prompt in get_suite(PROMPT_SUITE)]
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument(
        "--weights",
        default="bf16,int8,int4",
        help="comma list of specserve weight formats (fp32, bf16, int8, int4, gguf: the GGUF "
        "blocks as stored; fp32 is the dequantised reference of the log-likelihoods)",
    )
    p.add_argument(
        "--draft-weights",
        choices=WEIGHT_FORMATS,
        default=None,
        help="the draft's weight format in every arm (default: what `serve` picks beside the "
        "arm's target format: int4 beside gguf or bf16 where the native int4 kernels run, "
        "else the target's format)",
    )
    p.add_argument("--prompts", default="palindrome,cat", help=f"comma list of {prompt_ids}")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--k", type=int, default=4, help="draft length of fixed-k arms")
    p.add_argument(
        "--rounds",
        type=_positive_int,
        default=1,
        help="decode every prompt this many times with each specserve and llama.cpp arm, the "
        "arms of one prompt back to back (llama.cpp's beside gguf's, which read the same "
        "file), and keep each arm's median run: ratios that do not follow a host's drifting "
        "speed",
    )
    p.add_argument(
        "--arms",
        default="plain,draft,ngram,fused,transformers,llamacpp",
        help=f"which arm groups to run, of {', '.join(ARM_GROUPS)} (hybrid: suffix drafts where "
        "they are accepted, the draft model otherwise, adaptive k; vllm needs --vllm-python "
        "and --vllm-model-dir)",
    )
    p.add_argument(
        "--llama-python",
        default=os.environ.get("SPECSERVE_LLAMA_PYTHON", sys.executable),
        help="interpreter with llama_cpp (env SPECSERVE_LLAMA_PYTHON)",
    )
    p.add_argument(
        "--vllm-python",
        default=os.environ.get("SPECSERVE_VLLM_PYTHON") or None,
        help="interpreter with vllm for the vllm arms (env SPECSERVE_VLLM_PYTHON; without "
        "one, or without vllm importable there, the arms are printed as not run)",
    )
    p.add_argument(
        "--vllm-model-dir",
        default=None,
        help="bf16 Hugging Face directory of the target for the vllm arms, converted from "
        "the same GGUF file the specserve arms load (so that all arms run the same weights)",
    )
    p.add_argument(
        "--vllm-draft-dir",
        default=None,
        help="bf16 Hugging Face directory of the draft for the vllm draft arm, converted from "
        "the same GGUF file as --draft (without it only vllm plain runs)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch/llama.cpp threads")
    p.add_argument("--compile", action="store_true", help="torch.compile the decoders")
    p.add_argument(
        "--profile",
        action="store_true",
        help="only profile one decode step of the target per format (eager, RoPE tables, "
        "compiled) and exit",
    )
    p.add_argument(
        "--context-bucket",
        type=int,
        default=128,
        help="attention context bucket making verify == decode (0: off)",
    )


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
