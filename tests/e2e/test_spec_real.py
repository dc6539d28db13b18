"""Speculative decoding on real models: fp32 greedy output token-identical to plain decoding
for every proposer (SmolLM2-135M in the default suite; the Qwen2.5-Coder pair marked slow),
and the ``specserve generate`` command end to end."""

from __future__ import annotations

import copy

import pytest
import torch

from specserve.cli import main
from specserve.loading import LoadedModel
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.factory import make_proposer
from specserve.spec_decode.k_controller import KController
from specserve.spec_decode.plain_loop import generate_plain
from specserve.spec_decode.speculative_loop import generate_speculative

QUESTIONS = [
    "Repeat the following line 3 times: the cat sat on the mat.",
    "Write a Python function that adds two numbers.",
]


def chat_ids(lm: LoadedModel, question: str) -> list[int]:
    text = lm.tokenizer.apply_chat_template([{"role": "user", "content": question}])
    return list(lm.tokenizer.encode(text, add_special_tokens=False))


def assert_lossless(
    target: LoadedModel, draft_model: torch.nn.Module | None, method: str, ks: list, n: int
) -> None:
    proposer = make_proposer(method, target.arch.vocab_size, draft_model, max_model_len=512)
    eos = tuple(target.tokenizer.eos_token_ids)
    params = SamplingParams(max_tokens=n)
    for q in QUESTIONS:
        ids = chat_ids(target, q)
        plain = generate_plain(target.model, ids, params, eos)
        for k in ks:
            spec = generate_speculative(target.model, proposer, ids, params, eos, k)
            assert spec.token_ids == plain.token_ids, (method, k, q)
            assert spec.finish_reason == plain.finish_reason


@pytest.mark.parametrize("method", ["draft", "ngram", "suffix"])
def test_smollm2_greedy_is_lossless(smollm2: LoadedModel, method: str) -> None:
    # The draft is the same model in bf16: mostly right, sometimes wrong (near-ties).
    draft = copy.deepcopy(smollm2.model).to(torch.bfloat16) if method == "draft" else None
    ks: list = [1, 3, 7, 15, KController(8)]
    assert_lossless(smollm2, draft, method, ks, n=20)


def test_generate_command(smollm2: LoadedModel, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--model", "smollm2-135m-instruct", "--prompt", QUESTIONS[0], "--chat"]
    rc = main(
        [
            *argv,
            "--max-tokens",
            "16",
            "--spec-method",
            "ngram",
            "--num-speculative-tokens",
            "4",
            "--compare-plain",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "acceptance rate" in out and "mean acceptance length" in out
    assert "k per step: 4" in out and "verify" in out
    assert "speedup vs plain" in out and "identical to plain" in out
    assert main([*argv, "--spec-method", "draft"]) == 2  # draft method without a draft model
    assert "needs draft_model" in capsys.readouterr().err
    assert main([*argv, "--spec-method", "ngram", "--draft-weights", "int8"]) == 2
    assert "draft_weights given but method is 'ngram'" in capsys.readouterr().err


def test_generate_command_with_an_int8_draft_is_lossless_in_fp32(
    smollm2: LoadedModel, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "--model", "smollm2-135m-instruct", "--prompt", QUESTIONS[1], "--chat"]
    rc = main(
        [
            *argv,
            "--max-tokens",
            "16",
            "--draft-model",  # implies --spec-method draft, as in `specserve serve`
            "smollm2-135m-instruct",
            "--draft-weights",
            "int8",
            "--draft-confidence-threshold",
            "0.5",
            "--num-speculative-tokens",
            "3",
            "--dtype",
            "float32",  # the dequantised fp32 target (the default would be gguf in bf16)
            "--compare-plain",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "identical to plain" in out and "acceptance rate" in out
    assert "[draft]" in out


@pytest.fixture(scope="module")
def qwen_pair() -> tuple[LoadedModel, LoadedModel]:
    from specserve.loading import TransportError, load_model

    try:
        target = load_model("qwen2.5-coder-1.5b-instruct", dtype=torch.float32)
        draft = load_model("qwen2.5-coder-0.5b-instruct", dtype=torch.float32)
    except TransportError as e:
        pytest.skip(f"Qwen2.5-Coder pair unavailable: {e}")
    return target, draft


@pytest.mark.slow
@pytest.mark.parametrize("method", ["draft", "ngram", "suffix"])
def test_qwen_pair_greedy_is_lossless_fp32(
    qwen_pair: tuple[LoadedModel, LoadedModel], method: str
) -> None:
    target, draft = qwen_pair
    assert_lossless(target, draft.model if method == "draft" else None, method, [3, 7], n=24)


@pytest.mark.slow
def test_qwen_draft_0_5b_is_lossless_with_ngram_fp32(
    qwen_pair: tuple[LoadedModel, LoadedModel],
) -> None:
    _, small = qwen_pair
    assert_lossless(small, None, "ngram", [1, 15, KController(8)], n=24)
