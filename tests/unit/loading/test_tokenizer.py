"""Tokenizers built from GGUF metadata: ids equal transformers', chat templates, EOS ids."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from specserve.loading.chat_template import ChatTemplateError, render_chat_template
from specserve.loading.gguf_loader import GGUFFile
from specserve.loading.tokenizer import Tokenizer, backend_from_gguf
from specserve.models.arch import UnsupportedModelError

transformers = pytest.importorskip("transformers")

TEXTS = [
    "the cat sat in the hat",
    "def f(x):\n    return x ** 2  # square\n",
    "  leading  spaces\t\ttabs\n\n\nnewlines \n",
    "Numbers 12345, 3.14159 and 1,000,000",
    "Unicode: héllo wörld 日本語 🤖 ñ",
    "<|im_start|>user\nhi there<|im_end|>\n",
    "it's I'm we'll THEY'RE",
    "",
    "   ",
    "x=[1,2,3]\nprint(  x )\r\n",
]


@pytest.fixture(params=["qwen2", "llama"])
def tiny(request, gguf_factory) -> tuple[Path, Tokenizer]:  # type: ignore[no-untyped-def]
    path, _ = gguf_factory(request.param)
    return path, Tokenizer.from_gguf(GGUFFile(path).tokenizer_data())


@pytest.mark.parametrize("text", TEXTS)
def test_ids_equal_transformers_gguf_tokenizer(tiny, text: str) -> None:
    path, ours = tiny
    ref = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert ours.encode(text) == ref.encode(text)
    assert ours.decode(ours.encode(text), skip_special_tokens=False) == text


def test_smollm_pre_tokenizer_isolates_digits_like_llama_cpp(gguf_factory) -> None:
    """``pre = smollm`` splits every digit before GPT-2's regex (llama.cpp, and SmolLM2's own
    tokenizer.json). transformers' GGUF reader omits the digit split, so the two differ on
    whitespace before a digit; we follow llama.cpp."""
    path, _ = gguf_factory("llama")
    data = GGUFFile(path).tokenizer_data()
    assert data.pre == "smollm"
    pieces = [p for p, _ in backend_from_gguf(data).pre_tokenizer.pre_tokenize_str("a  12")]
    assert pieces == ["a", "ĠĠ", "1", "2"]


def test_merges_and_special_tokens(tiny) -> None:
    _, tok = tiny
    the = tok.token_to_id("Ġthe")
    assert the is not None and the in tok.encode(" the")
    ids = tok.encode("<|im_start|>user")
    assert ids[0] == tok.token_to_id("<|im_start|>")
    assert tok.decode(ids) == "user"  # special tokens skipped by default
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>user"


def test_generation_eos_ids_and_bos(tiny) -> None:
    _, tok = tiny
    im_end, eot = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    assert tok.eos_token_id == im_end
    # Template ends turns with <|im_end|>; padding is <|endoftext|> (pretraining end of text).
    assert tok.eos_token_ids == (im_end, eot)
    assert tok.bos_token_id == tok.token_to_id("<|im_start|>")
    assert tok.encode("hi")[0] != tok.bos_token_id  # add_bos_token is false in the file


def test_bos_added_when_the_file_says_so(gguf_factory) -> None:
    path, _ = gguf_factory("qwen2")
    data = dataclasses.replace(GGUFFile(path).tokenizer_data(), add_bos_token=True)
    tok = Tokenizer.from_gguf(data)
    assert tok.encode("hi")[0] == tok.bos_token_id
    assert tok.encode("hi", add_special_tokens=False)[0] != tok.bos_token_id


def test_chat_template_rendering(tiny) -> None:
    _, tok = tiny
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(msgs) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert not tok.apply_chat_template(msgs, add_generation_prompt=False).endswith("assistant\n")
    # encode_chat: the rendered text, encoded without adding special tokens a second time.
    ids = tok.encode_chat(msgs)
    assert ids == tok.encode(tok.apply_chat_template(msgs), add_special_tokens=False)
    assert ids[0] != tok.bos_token_id or tok.apply_chat_template(msgs).startswith(
        tok.decode([tok.bos_token_id], skip_special_tokens=False)
    )


def test_chat_template_helpers_and_errors() -> None:
    src = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}"
        "{% endif %}{{ messages | tojson }}{{ bos_token }}"
    )
    out = render_chat_template(src, [{"role": "user", "content": "ünï"}], bos_token="<s>")
    assert out == '[{"role": "user", "content": "ünï"}]<s>'
    with pytest.raises(ChatTemplateError, match="first must be user"):
        render_chat_template(src, [{"role": "assistant", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="role"):
        render_chat_template(src, [{"content": "no role"}])
    with pytest.raises(ChatTemplateError, match="invalid chat template"):
        render_chat_template("{% for %}", [])


def test_sandbox_blocks_python_internals() -> None:
    with pytest.raises(ChatTemplateError):
        render_chat_template("{{ messages.__class__.__mro__[1].__subclasses__() }}", [])


def test_no_chat_template_is_a_clear_error(gguf_factory) -> None:
    path, _ = gguf_factory("qwen2")
    data = dataclasses.replace(GGUFFile(path).tokenizer_data(), chat_template=None)
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer.from_gguf(data).apply_chat_template([{"role": "user", "content": "x"}])


def test_save_and_load_roundtrip(tiny, tmp_path: Path) -> None:
    _, tok = tiny
    tok.save(tmp_path / "tok")
    again = Tokenizer.load(tmp_path / "tok")
    for text in TEXTS:
        assert again.encode(text) == tok.encode(text)
    assert again.eos_token_ids == tok.eos_token_ids
    assert again.chat_template == tok.chat_template
    assert again.vocab_size == tok.vocab_size


def test_unsupported_tokenizers_are_named(gguf_factory) -> None:
    path, _ = gguf_factory("qwen2")
    data = GGUFFile(path).tokenizer_data()
    with pytest.raises(UnsupportedModelError, match="'llama'"):
        backend_from_gguf(dataclasses.replace(data, model="llama"))
    with pytest.raises(UnsupportedModelError, match="'mystery-pre'"):
        backend_from_gguf(dataclasses.replace(data, pre="mystery-pre"))


def test_load_tokenizer_reads_only_the_tokenizer(tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from specserve.loading import load_tokenizer
    from specserve.loading.errors import ModelNotFoundError

    path, expected = tiny
    got = load_tokenizer(path)
    for text in TEXTS:
        assert got.encode(text, add_special_tokens=False) == expected.encode(
            text, add_special_tokens=False
        )
    with pytest.raises(ModelNotFoundError, match="neither a catalog name nor an existing path"):
        load_tokenizer(tmp_path / "nothing-here")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(UnsupportedModelError, match=r"not a \.gguf file"):
        load_tokenizer(tmp_path / "weights.bin")
