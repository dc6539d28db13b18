"""The ``logprobs`` of OpenAI responses, built from the engine's per-token logprobs.

Two shapes, as OpenAI and vLLM return them:

* completions (``logprobs: N``, 0..20): ``choices[].logprobs`` holds ``tokens``,
  ``token_logprobs``, ``top_logprobs`` (per token a ``{token text: logprob}`` map of the chosen
  token plus the N most likely, so up to N + 1 entries) and ``text_offset`` (where each token
  starts in the returned text, counted from the start of the text, the echoed prompt
  included; streamed chunks continue the count). With ``echo`` the prompt tokens come first,
  the first with ``null`` logprob and top map (nothing scores it).
* chat (``logprobs: true``, ``top_logprobs: N``, 0..20): ``choices[].logprobs.content[]``, one
  ``{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}] * N}`` per token, the N
  most likely first.

Values are the target model's raw log-probabilities (``sampling/logprobs.py``), the same with
speculation on or off. OpenAI caps completions at 5 alternatives; like vLLM (its default
``max_logprobs``) this server allows 20 on both endpoints. ``-inf`` is sent as -9999.0, as
OpenAI and vLLM do (JSON has no infinity).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from specserve.sampling.logprobs import TokenLogprob

LOGPROB_FLOOR = -9999.0


class CompletionLogprobs(BaseModel):
    """``choices[].logprobs`` of ``/v1/completions``."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class TopLogprob(BaseModel):
    """One alternative at a chat token's position."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    """One generated token of a chat reply and the most likely tokens at its position."""

    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    """``choices[].logprobs`` of ``/v1/chat/completions`` (and of each streamed chunk)."""

    content: list[ChatTokenLogprob] | None = None


def _floor(value: float) -> float:
    return max(value, LOGPROB_FLOOR)


class LogprobRenderer:
    """Turns engine logprobs into response logprobs for one request.

    Attributes:
        num_top: alternatives the request asked for.
        text_offset: where the next token starts in the text returned so far (completions).
    """

    def __init__(self, tokenizer: Any, num_top: int) -> None:
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}
        self.num_top = num_top
        self.text_offset = 0

    def token_text(self, token_id: int) -> str:
        """The token on its own, special tokens spelled out (``token_id:N`` without a
        tokenizer)."""
        text = self._texts.get(token_id)
        if text is None:
            if self._tokenizer is None:
                text = f"token_id:{token_id}"
            else:
                text = str(self._tokenizer.decode([token_id], skip_special_tokens=False))
            self._texts[token_id] = text
        return text

    def completion(
        self, entries: Sequence[TokenLogprob | None], token_ids: Sequence[int]
    ) -> CompletionLogprobs:
        """Logprobs of ``token_ids`` (an entry of None: a first prompt token, unscored)."""
        out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
        for token_id, entry in zip(token_ids, entries, strict=True):
            text = self.token_text(token_id)
            out.tokens.append(text)
            out.text_offset.append(self.text_offset)
            self.text_offset += len(text)
            if entry is None:
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
                continue
            out.token_logprobs.append(_floor(entry.logprob))
            top = {text: _floor(entry.logprob)}
            for alt_id, value in entry.top[: self.num_top]:
                top.setdefault(self.token_text(alt_id), _floor(value))
            out.top_logprobs.append(top)
        return out

    def _top(self, token_id: int, value: float) -> TopLogprob:
        text = self.token_text(token_id)
        return TopLogprob(token=text, logprob=_floor(value), bytes=list(text.encode()))

    def chat(self, entries: Sequence[TokenLogprob]) -> ChatLogprobs:
        """``logprobs.content`` for generated tokens."""
        content = []
        for entry in entries:
            head = self._top(entry.token_id, entry.logprob)
            alts = [self._top(t, v) for t, v in entry.top[: self.num_top]]
            content.append(ChatTokenLogprob(**head.model_dump(), top_logprobs=alts))
        return ChatLogprobs(content=content)
