"""What the server needs from the engine and its tokenizer (structural types).

``specserve.engine.AsyncEngine`` satisfies :class:`EngineClient`; the server depends on
these protocols only, so it can be type-checked and read without the engine's internals.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from specserve.engine.outputs import RequestOutput
from specserve.sampling_params import SamplingParams


class Tokenizer(Protocol):
    eos_token_ids: Sequence[int]

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str: ...


# One streamed step of one request: the engine's own dataclass (its fields only grow).
EngineOutput = RequestOutput


class EngineClient(Protocol):
    tokenizer: Any  # a Tokenizer, or None for token-id-only engines
    arch: Any  # the target's ArchConfig (vocab_size)
    model_name: str
    max_model_len: int

    def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[EngineOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> Any: ...

    async def shutdown(self, drain: bool = True) -> None: ...
