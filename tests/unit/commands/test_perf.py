"""Pieces of ``specserve perf``: a missing llama_cpp is reported (not skipped), bytes per
token, quality measures, and the CLI registration."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from specserve.cli import build_parser
from specserve.models.quant.quantize import quantize_model
from specserve.perf.arms import ArmResult, decode_bytes_per_token, run_llamacpp
from specserve.perf.report import (
    common_prefix_fraction,
    mean_log_likelihood,
    quality_vs,
)
from tests.conftest import make_tiny_model


def test_missing_llama_cpp_is_reported(tmp_path: Path) -> None:
    gguf = tmp_path / "model-q4_k_m.gguf"
    gguf.write_bytes(b"GGUF")
    python = sys.executable  # the project venv has no llama_cpp
    arms = run_llamacpp(python, gguf, [[1, 2, 3]], 4, (0,), 1)
    assert len(arms) == 2
    for arm in arms:
        assert arm.error is not None and "llama_cpp" in arm.error


def test_bytes_per_token_counts_weights_not_the_embedding_table() -> None:
    model = make_tiny_model("qwen2", hidden_size=64, intermediate_size=128)  # tied head
    v, h = model.cfg.vocab_size, model.cfg.hidden_size
    fp32 = decode_bytes_per_token(model)
    assert fp32 >= v * h * 4  # the tied table is read as the LM head
    q4 = decode_bytes_per_token(quantize_model(model.to(torch.bfloat16), "int4", 32))
    assert q4 < fp32 / 5


def test_quality_measures() -> None:
    assert common_prefix_fraction([1, 2, 3, 4], [1, 2, 9, 4]) == 0.5
    assert common_prefix_fraction([1, 2], [1, 2]) == 1.0
    ref = ArmResult("specserve bf16 plain", token_ids=[[1, 2, 3], [4, 5]])
    q4 = ArmResult("specserve int4 plain", token_ids=[[1, 2, 7], [4, 5]])
    (q,) = quality_vs({"bf16": ref, "int4": q4}, "bf16")
    assert q.fmt == "int4" and q.exact_match == 0.5
    assert abs(q.prefix_fraction - (2 / 3 + 1) / 2) < 1e-9
    ll = mean_log_likelihood(make_tiny_model("llama"), [5, 6, 7, 8, 9])
    assert ll < 0 and ll == ll


def test_perf_command_is_registered() -> None:
    args = build_parser().parse_args(["perf", "--weights", "int4", "--profile"])
    assert args.weights == "int4" and args.profile and args.context_bucket == 128
