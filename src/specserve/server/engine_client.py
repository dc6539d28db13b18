"""What the server needs from the engine and its tokenizer (structural types).

``specserve.engine.AsyncEngine`` satisfies :class:`EngineClient`; the server depends on
these protocols only, so it can be type-checked and read without the engine's internals.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from specserve.sampling_params import SamplingParams


class Tokenizer(Protocol):
    eos_token_ids: Sequence[int]

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str: ...


class SpecSummary(Protocol):
    """Per-request acceptance counters carried by a request output."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int

    @property
    def mean_acceptance_length(self) -> float: ...


class EngineOutput(Protocol):
    """One streamed step of one request (the engine's ``RequestOutput``)."""

    request_id: str
    new_token_ids: list[int]
    text_delta: str
    num_prompt_tokens: int
    num_generated_tokens: int
    finished: bool
    finish_reason: str | None
    spec: SpecSummary | None


class EngineClient(Protocol):
    tokenizer: Any
    model_name: str
    max_model_len: int

    def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[EngineOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> Any: ...

    async def shutdown(self, drain: bool = True) -> None: ...
