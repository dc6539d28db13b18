"""``specserve serve`` argument parsing into an EngineConfig."""

from __future__ import annotations

import argparse

import pytest

from specserve.cli import build_parser
from specserve.commands.serve import engine_config_from_args, parse_k, parse_size


def test_sizes() -> None:
    assert parse_size("2GiB") == 2 << 30
    assert parse_size("512M") == 512 << 20
    assert parse_size("1.5g") == 3 << 29
    assert parse_size("4096") == 4096
    for bad in ("", "lots", "-1G", "0"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_size(bad)


def test_k() -> None:
    assert parse_k("auto") is None
    assert parse_k("7") == 7
    for bad in ("x", "-1", "33"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_k(bad)


def test_draft_model_implies_draft_method() -> None:
    args = build_parser().parse_args(
        ["serve", "--model", "t", "--draft-model", "d", "--num-speculative-tokens", "3",
         "--max-queue-len", "5", "--kv-cache-memory", "256MiB", "--dtype", "bfloat16"]
    )  # fmt: skip
    config = engine_config_from_args(args)
    assert config.spec.method == "draft" and config.spec.draft_model == "d"
    assert config.spec.num_speculative_tokens == 3
    assert config.scheduler.max_queue_len == 5
    assert config.cache.memory_bytes == 256 << 20
    assert config.model.dtype == "bfloat16"
    assert args.host == "127.0.0.1"


def test_defaults_are_plain_decoding_and_adaptive_k() -> None:
    config = engine_config_from_args(build_parser().parse_args(["serve", "--model", "t"]))
    assert config.spec.method == "none" and not config.spec.enabled
    ngram = build_parser().parse_args(["serve", "--model", "t", "--spec-method", "ngram"])
    assert engine_config_from_args(ngram).spec.adaptive


def test_inconsistent_choice_is_refused() -> None:
    args = build_parser().parse_args(
        ["serve", "--model", "t", "--draft-model", "d", "--spec-method", "ngram"]
    )
    with pytest.raises(ValueError, match="draft_model"):
        engine_config_from_args(args)


def test_weights_and_truncated_draft_reach_the_engine_config() -> None:
    argv = ["serve", "--model", "t", "--draft-model", "d", "--draft-num-layers", "6"]
    args = build_parser().parse_args([*argv, "--weights", "int8"])
    config = engine_config_from_args(args)
    assert config.model.weights == "int8"
    assert config.spec.draft_num_layers == 6


def test_draft_weights_reach_the_spec_config_and_need_a_draft() -> None:
    argv = ["serve", "--model", "t", "--dtype", "bfloat16", "--draft-model", "d"]
    config = engine_config_from_args(build_parser().parse_args([*argv, "--draft-weights", "int4"]))
    assert config.spec.draft_weights == "int4" and config.model.weights is None
    no_draft = ["serve", "--model", "t", "--spec-method", "ngram", "--draft-weights", "int4"]
    with pytest.raises(ValueError, match="draft_weights given but method is 'ngram'"):
        engine_config_from_args(build_parser().parse_args(no_draft))


def test_disable_by_batch_size_reaches_the_spec_config() -> None:
    argv = ["serve", "--model", "t", "--spec-method", "ngram"]
    args = build_parser().parse_args([*argv, "--speculative-disable-by-batch-size", "4"])
    assert engine_config_from_args(args).spec.disable_by_batch_size == 4
    args = build_parser().parse_args([*argv, "--speculative-disable-by-batch-size", "0"])
    with pytest.raises(ValueError, match="disable_by_batch_size must be >= 1"):
        engine_config_from_args(args)


def test_truncated_draft_needs_a_draft_model() -> None:
    args = build_parser().parse_args(["serve", "--model", "t", "--draft-num-layers", "6"])
    with pytest.raises(ValueError, match="draft_num_layers=6 needs a draft model"):
        engine_config_from_args(args)


@pytest.mark.parametrize(
    ("flags", "dtype"),
    [
        ([], "float32"),  # fp32 weights by default: fp32 compute, as before
        (["--weights", "int4"], "bfloat16"),
        (["--weights", "int8"], "bfloat16"),
        (["--weights", "bf16"], "bfloat16"),
        (["--draft-model", "d", "--draft-weights", "int4"], "bfloat16"),
        (["--weights", "int4", "--device", "cuda"], "float32"),  # no native CPU kernel there
        (["--weights", "int4", "--dtype", "bfloat16"], "bfloat16"),
    ],
)
def test_auto_dtype_follows_the_weight_format(flags: list[str], dtype: str) -> None:
    args = build_parser().parse_args(["serve", "--model", "t", *flags])
    assert args.dtype == "auto" or "--dtype" in flags
    assert engine_config_from_args(args).model.dtype == dtype


def test_explicit_fp32_with_int4_weights_is_kept_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    args = build_parser().parse_args(
        ["serve", "--model", "t", "--weights", "int4", "--dtype", "float32"]
    )
    with caplog.at_level("WARNING"):
        config = engine_config_from_args(args)
    assert config.model.dtype == "float32"
    assert any("--dtype float32 with int4 weights" in r.getMessage() for r in caplog.records)


def test_unknown_dtype_is_refused() -> None:
    from specserve.config import resolve_dtype

    with pytest.raises(ValueError, match="unknown dtype 'fp8'; known: auto"):
        resolve_dtype("fp8", None)
