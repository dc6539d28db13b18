"""Tokenizer: a ``tokenizers.Tokenizer`` plus special ids, generation EOS ids and chat template.

Built from a GGUF file's metadata (byte-level BPE, ``tokenizer.ggml.model == "gpt2"``) or
loaded from a Hugging Face ``tokenizer.json``. The GGUF pre-tokenizer (``tokenizer.ggml.pre``)
decides how text is split before BPE, exactly as llama.cpp does for that name:

- ``qwen2``: Qwen2's split regex (single digits, letters with one leading non-letter, ...).
- ``smollm`` (and the StarCoder family): every digit isolated, then GPT-2's regex.
- ``gpt2`` / ``default``: GPT-2's regex.
- ``llama3`` / ``llama-bpe``: Llama 3's regex.

**Generation EOS ids** (``eos_token_ids``) are the ids that end a reply: the file's EOS id,
plus the chat template's end-of-turn token (e.g. ``<|im_end|>``) when the template uses one,
plus ``<|endoftext|>`` when the file uses it as padding (a sign it was the pretraining
end-of-document token, which instruct models still emit). This gives Qwen2.5 instruct
``<|im_end|>`` and ``<|endoftext|>``, and SmolLM2 instruct ``<|im_end|>`` only, like their
``generation_config.json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer

from specserve.loading.chat_template import render_chat_template
from specserve.loading.gguf_loader import GGUFTokenizerData
from specserve.models.arch import UnsupportedModelError

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "codeshell", "command-r", "exaone")
_END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|eom_id|>")
_CONTROL, _USER_DEFINED = 3, 4
CONFIG_FILE = "specserve_tokenizer.json"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (byte-level BPE alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1))
    printable += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in ("qwen2", "deepseek-r1-qwen"):
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(_QWEN2_SPLIT), "isolated"), byte_level]
        )
    if pre in ("llama3", "llama-v3", "llama-bpe"):
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), "isolated"), byte_level]
        )
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in (None, "default", "gpt2", "gpt-2"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raise UnsupportedModelError(f"unsupported GGUF pre-tokenizer {pre!r}")


def backend_from_gguf(data: GGUFTokenizerData) -> BackendTokenizer:
    """A ``tokenizers.Tokenizer`` equivalent to llama.cpp's for this byte-level BPE vocabulary."""
    if data.model != "gpt2":
        raise UnsupportedModelError(
            f"unsupported GGUF tokenizer model {data.model!r} (only byte-level BPE 'gpt2')"
        )
    alphabet = _bytes_to_unicode()
    allowed = set(alphabet.values())
    # Byte-level vocabularies spell every token in the byte alphabet; respell any that is not.
    vocab = {
        tok if set(tok) <= allowed else "".join(alphabet[b] for b in tok.encode("utf-8")): i
        for i, tok in enumerate(data.tokens)
    }
    merges = [tuple(m.split(" ", 1)) for m in data.merges]
    backend = BackendTokenizer(
        models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=False)  # type: ignore[arg-type]
    )
    backend.pre_tokenizer = _pre_tokenizer(data.pre)
    backend.decoder = decoders.ByteLevel()
    types = data.token_types
    backend.add_special_tokens(
        [
            AddedToken(t, normalized=False, special=True)
            for t, ty in zip(data.tokens, types, strict=False)
            if ty == _CONTROL and set(t) <= allowed
        ]
    )
    backend.add_tokens(
        [
            AddedToken(t, normalized=False, special=False)
            for t, ty in zip(data.tokens, types, strict=False)
            if ty == _USER_DEFINED and t in vocab
        ]
    )
    single, special = "$A", []
    if data.add_bos_token and data.bos_token_id is not None:
        bos = data.tokens[data.bos_token_id]
        single, special = f"{bos} {single}", [(bos, data.bos_token_id)]
    if data.add_eos_token and data.eos_token_id is not None:
        eos = data.tokens[data.eos_token_id]
        single = f"{single} {eos}"
        special.append((eos, data.eos_token_id))
    if special:
        backend.post_processor = processors.TemplateProcessing(
            single=single, special_tokens=special
        )
    return backend


def generation_eos_ids(
    backend: BackendTokenizer,
    eos_token_id: int | None,
    pad_token_id: int | None,
    chat_template: str | None,
) -> tuple[int, ...]:
    """The ids that end a reply (see the module docstring for the rule)."""
    ids: list[int] = [] if eos_token_id is None else [eos_token_id]
    for tok in _END_OF_TURN_TOKENS:
        tid = backend.token_to_id(tok)
        if tid is not None and chat_template and tok in chat_template:
            ids.append(tid)
    if pad_token_id is not None and backend.id_to_token(pad_token_id) == "<|endoftext|>":
        ids.append(pad_token_id)
    return tuple(dict.fromkeys(ids))


class Tokenizer:
    """Text <-> token ids, with the model's special tokens and chat template.

    Attributes:
        backend: the ``tokenizers.Tokenizer`` doing the work.
        bos_token_id / eos_token_id / pad_token_id: the model's special ids (None if unset).
        eos_token_ids: ids that end generation (``eos_token_id`` plus end-of-turn tokens).
        chat_template: Jinja source, or None when the model has none.
    """

    def __init__(
        self,
        backend: BackendTokenizer,
        *,
        bos_token_id: int | None,
        eos_token_id: int | None,
        pad_token_id: int | None = None,
        eos_token_ids: Sequence[int] | None = None,
        chat_template: str | None = None,
    ) -> None:
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.chat_template = chat_template
        self.eos_token_ids: tuple[int, ...] = (
            tuple(eos_token_ids)
            if eos_token_ids is not None
            else generation_eos_ids(backend, eos_token_id, pad_token_id, chat_template)
        )

    @classmethod
    def from_gguf(cls, data: GGUFTokenizerData) -> Tokenizer:
        return cls(
            backend_from_gguf(data),
            bos_token_id=data.bos_token_id,
            eos_token_id=data.eos_token_id,
            pad_token_id=data.pad_token_id,
            chat_template=data.chat_template,
        )

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (including added tokens)."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special-token strings in the text map to their ids."""
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        tid = self.backend.token_to_id(token)
        return None if tid is None else int(tid)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def _token_str(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.backend.id_to_token(token_id)

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of a conversation rendered with the chat template. The template already
        holds the special tokens the model wants (BOS, turn markers), so none are added."""
        text = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        return self.encode(text, add_special_tokens=False)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """Render a conversation with the model's chat template (ValueError if it has none)."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; use a plain completion prompt")
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self._token_str(self.bos_token_id),
            eos_token=self._token_str(self.eos_token_id),
            **extra,
        )

    def save(self, directory: Path) -> None:
        """Write ``tokenizer.json`` and our small config (special ids, template) to a dir."""
        directory.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(directory / "tokenizer.json"))
        config = {
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "eos_token_ids": list(self.eos_token_ids),
            "chat_template": self.chat_template,
        }
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=1))

    @classmethod
    def load(cls, directory: Path) -> Tokenizer:
        """Inverse of :meth:`save`."""
        config = json.loads((directory / CONFIG_FILE).read_text())
        return cls(
            BackendTokenizer.from_file(str(directory / "tokenizer.json")),
            bos_token_id=config["bos_token_id"],
            eos_token_id=config["eos_token_id"],
            pad_token_id=config["pad_token_id"],
            eos_token_ids=config["eos_token_ids"],
            chat_template=config["chat_template"],
        )
