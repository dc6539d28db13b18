"""Incremental detokenization with stop strings.

Decoding one token at a time is wrong for byte-level BPE (a character may span tokens) and for
SentencePiece (a token's leading space depends on its left neighbour), so each new token is
decoded together with a few tokens before it and only the text that grew is taken. Text that
could be the beginning of a stop string is held back until the next tokens decide it.
"""

from __future__ import annotations

from collections.abc import Sequence

from specserve.loading.tokenizer import Tokenizer
from specserve.sampling.stop import find_stop_string

# Prompt tokens decoded as left context for the first output tokens.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Turns a request's output tokens into text, one token at a time.

    Attributes:
        text: the output text so far (cut at a stop string once one is found).
        stopped: a stop string was found.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int],
        stop: tuple[str, ...] = (),
        min_tokens: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.min_tokens = min_tokens
        context = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._ids = context
        self._prefix_offset = 0  # start of the window decoded for context
        self._read_offset = len(context)  # tokens before this are already in ``text``
        self._num_outputs = 0
        self._emitted = 0  # characters of ``text`` already returned by ``take_delta``
        self.text = ""
        self.stopped = False

    def _append(self, token_id: int) -> None:
        self._ids.append(token_id)
        self._num_outputs += 1
        window = self._ids[self._prefix_offset :]
        prefix_text = self.tokenizer.decode(
            self._ids[self._prefix_offset : self._read_offset], skip_special_tokens=True
        )
        full_text = self.tokenizer.decode(window, skip_special_tokens=True)
        # A trailing U+FFFD means an incomplete UTF-8 sequence: wait for the next token.
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            self.text += full_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)

    def add_tokens(self, token_ids: Sequence[int]) -> int:
        """Append tokens in order, stopping at the first one that completes a stop string.

        Stop strings count only once ``min_tokens`` tokens were generated (like EOS).

        Returns:
            how many of ``token_ids`` were consumed (all of them unless a stop string ended
            generation; the text is then cut where the stop string starts).
        """
        assert not self.stopped
        for i, tok in enumerate(token_ids):
            before = len(self.text)
            self._append(tok)
            if self.stop and self._num_outputs >= self.min_tokens:
                idx = find_stop_string(self.text, self.stop, before)
                if idx is not None:
                    self.text = self.text[:idx]
                    self.stopped = True
                    return i + 1
        return len(token_ids)

    def _held_back(self) -> int:
        """Length of the longest suffix of ``text`` that begins some stop string."""
        if self.stopped or not self.stop:
            return 0
        longest = min(max(len(s) for s in self.stop) - 1, len(self.text))
        for n in range(longest, 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0

    def take_delta(self, final: bool = False) -> str:
        """Text that became final since the last call (everything when ``final``)."""
        end = len(self.text) if final else len(self.text) - self._held_back()
        end = max(end, self._emitted)
        delta = self.text[self._emitted : end]
        self._emitted = end
        return delta
