"""Incremental detokenizer: multi-byte characters, stop strings and held-back text."""

from __future__ import annotations

from specserve.engine.detokenizer import IncrementalDetokenizer


class ByteTokenizer:
    """A byte-level tokenizer (one id per byte, like ByT5): decoding a lone byte of a multi-byte
    character yields U+FFFD, which exercises the detokenizer's wait-for-more logic."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


TOK = ByteTokenizer()


def stream(text: str, stop: tuple[str, ...] = (), min_tokens: int = 0) -> tuple[list[str], int]:
    detok = IncrementalDetokenizer(TOK, TOK.encode("prompt "), stop, min_tokens)
    ids = TOK.encode(text)
    deltas = []
    for i, t in enumerate(ids):
        consumed = detok.add_tokens([t])
        deltas.append(detok.take_delta(final=detok.stopped or i == len(ids) - 1))
        if detok.stopped:
            assert consumed == 1
            return deltas, i + 1
    return deltas, len(ids)


def test_multibyte_characters_are_never_split() -> None:
    deltas, _ = stream("héllo → wörld")
    assert "".join(deltas) == "héllo → wörld"
    assert all("\ufffd" not in d for d in deltas)


def test_stop_string_cuts_text_and_reports_the_token() -> None:
    deltas, n = stream("abc STOP def", stop=("STOP",))
    assert "".join(deltas) == "abc "
    assert n == len("abc STOP")


def test_partial_stop_is_held_back_then_released() -> None:
    detok = IncrementalDetokenizer(TOK, [], ("END",))
    detok.add_tokens(TOK.encode("xE"))
    assert detok.take_delta() == "x"  # "E" may begin "END"
    detok.add_tokens(TOK.encode("N"))
    assert detok.take_delta() == ""
    detok.add_tokens(TOK.encode("o"))
    assert detok.take_delta() == "ENo"


def test_several_tokens_at_once_stop_at_the_right_one() -> None:
    detok = IncrementalDetokenizer(TOK, [], ("\n\n",))
    consumed = detok.add_tokens(TOK.encode("ab\n\ncd"))
    assert consumed == 4 and detok.stopped
    assert detok.take_delta(final=True) == "ab"


def test_stop_strings_ignored_before_min_tokens() -> None:
    deltas, n = stream("ab.cd.ef", stop=(".",), min_tokens=4)
    assert "".join(deltas) == "ab.cd"
    assert n == 6
