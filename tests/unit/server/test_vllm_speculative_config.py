"""``specserve serve --speculative-config '{json}'``: vLLM's spelling mapped onto specserve's
speculation settings, and every refusal naming what is wrong."""

from __future__ import annotations

import json
import logging

import pytest

from specserve.cli import build_parser
from specserve.commands.serve import engine_config_from_args
from specserve.commands.vllm_spec import KNOWN_KEYS, parse_speculative_config
from specserve.config import SpecConfig


def spec_of(config: object, *extra: str) -> SpecConfig:
    text = config if isinstance(config, str) else json.dumps(config)
    argv = ["serve", "--model", "t", "--speculative-config", text, *extra]
    return engine_config_from_args(build_parser().parse_args(argv)).spec


def test_ngram_with_prompt_lookup() -> None:
    spec = spec_of(
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
         "prompt_lookup_max": 5}
    )  # fmt: skip
    assert (spec.method, spec.num_speculative_tokens) == ("ngram", 4)
    assert (spec.ngram_min, spec.ngram_max) == (2, 5)
    assert spec.draft_model is None
    # One bound sets the other, as in vLLM; neither keeps specserve's defaults.
    only_max = spec_of({"method": "ngram", "prompt_lookup_max": 3})
    assert (only_max.ngram_min, only_max.ngram_max) == (3, 3)
    default = spec_of({"method": "[ngram]", "num_speculative_tokens": 2})
    assert (default.ngram_min, default.ngram_max) == (
        SpecConfig().ngram_min,
        SpecConfig().ngram_max,
    )
    assert spec_of({"model": "ngram", "num_speculative_tokens": 2}).method == "ngram"


def test_draft_model_and_suffix() -> None:
    spec = spec_of({"method": "draft_model", "model": "d", "num_speculative_tokens": 5})
    assert (spec.method, spec.draft_model, spec.num_speculative_tokens) == ("draft", "d", 5)
    implied = spec_of({"model": "/models/d", "num_speculative_tokens": 3})
    assert (implied.method, implied.draft_model) == ("draft", "/models/d")
    suffix = spec_of({"method": "suffix"})
    assert suffix.method == "suffix" and suffix.adaptive  # no k: specserve's adaptive k


def test_disable_by_batch_size_and_own_draft_flags_combine() -> None:
    spec = spec_of(
        {"method": "draft_model", "model": "d", "disable_by_batch_size": 8},
        "--draft-weights", "int4", "--k-max", "6",
    )  # fmt: skip
    assert spec.disable_by_batch_size == 8
    assert spec.draft_weights == "int4" and spec.k_max == 6 and spec.adaptive


def test_ignored_keys_warn(caplog: pytest.LogCaptureFixture) -> None:
    config = {"model": "d", "num_speculative_tokens": 5, "method": "draft_model",
              "draft_tensor_parallel_size": 1, "max_model_len": 2048}  # fmt: skip
    with caplog.at_level(logging.WARNING):
        spec = spec_of(config)
    assert spec.method == "draft" and spec.num_speculative_tokens == 5
    text = caplog.text
    assert "draft_tensor_parallel_size is ignored" in text and "max_model_len is ignored" in text


def test_deploy_reference_spelling_is_accepted() -> None:
    """What ``specserve deploy`` writes for vLLM's server parses here too."""
    deploy_json = '{"model": "/models/Qwen/Qwen3-0.6B", "num_speculative_tokens": 5, ' \
        '"method": "draft_model"}'  # fmt: skip
    spec = spec_of(deploy_json)
    assert spec.draft_model == "/models/Qwen/Qwen3-0.6B"
    ngram = spec_of('{"num_speculative_tokens": 4, "method": "ngram", "prompt_lookup_max": 4}')
    assert ngram.method == "ngram" and ngram.ngram_max == 4


@pytest.mark.parametrize(("method", "ours"), [("eagle3", "eagle"), ("medusa", "medusa")])
def test_head_methods_take_the_head_directory(method: str, ours: str) -> None:
    spec = spec_of(json.dumps({"method": method, "model": "/heads/h", "num_speculative_tokens": 4}))
    assert spec.method == ours and spec.draft_model == "/heads/h"
    assert spec.num_speculative_tokens == 4
    with pytest.raises(ValueError, match=f"method '{method}' needs 'model' \\(the head's"):
        parse_speculative_config(json.dumps({"method": method}))


@pytest.mark.parametrize("method", ["eagle", "mlp_speculator", "mtp"])
def test_unimplemented_methods_are_refused(method: str) -> None:
    with pytest.raises(ValueError, match=f"method '{method}' is not implemented in specserve yet"):
        parse_speculative_config(json.dumps({"method": method, "model": "m"}))


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ({"method": "ngram", "prompt_lookup": 3}, "unknown key 'prompt_lookup'; known keys: "
         + ", ".join(KNOWN_KEYS)),
        ({"method": "ngram", "tensor_parallel_size": 2}, "unknown key 'tensor_parallel_size'"),
        ({"method": "lookahead"},
         "unknown method 'lookahead'; known: draft_model, eagle3, medusa, ngram, suffix"),
        ({"num_speculative_tokens": 3}, "needs 'method'"),
        ({"method": "draft_model", "num_speculative_tokens": 3}, "needs 'model'"),
        ({"method": "ngram", "model": "/models/d"}, "method 'ngram' takes none"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be in"),
        ({"method": "ngram", "num_speculative_tokens": 33}, "in [1, 32], got 33"),
        ({"method": "ngram", "num_speculative_tokens": "4"}, "must be an integer, got '4'"),
        ({"method": "ngram", "num_speculative_tokens": True}, "must be an integer, got True"),
        ({"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2},
         "prompt_lookup_min=4 must be <= prompt_lookup_max=2"),
        ({"method": "draft_model", "model": "d", "prompt_lookup_max": 2}, "for method ngram only"),
        ({"method": "ngram", "disable_by_batch_size": 0}, "disable_by_batch_size must be >= 1"),
        ({"method": "ngram", "draft_tensor_parallel_size": "x"}, "must be an integer"),
        ({"method": 3}, "method must be a string"),
    ],
)  # fmt: skip
def test_bad_configs_are_refused_by_name(config: object, says: str) -> None:
    text = config if isinstance(config, str) else json.dumps(config)
    with pytest.raises(ValueError, match="--speculative-config") as info:
        parse_speculative_config(text)
    assert says in str(info.value)


@pytest.mark.parametrize(
    "flags",
    [
        ["--spec-method", "ngram"],
        ["--draft-model", "d"],
        ["--num-speculative-tokens", "auto"],
        ["--num-speculative-tokens", "4"],
        ["--speculative-disable-by-batch-size", "4"],
    ],
)
def test_both_spellings_conflict(flags: list[str]) -> None:
    with pytest.raises(ValueError, match=f"--speculative-config and {flags[0]} both configure"):
        spec_of({"method": "ngram"}, *flags)


def test_serve_exits_2_on_a_bad_config(capsys: pytest.CaptureFixture[str]) -> None:
    from specserve.cli import main

    assert main(["serve", "--model", "t", "--speculative-config", '{"method": "eagle"}']) == 2
    assert "not implemented in specserve yet" in capsys.readouterr().err
