"""What the server needs from the engine (a structural type).

``specserve.engine.async_engine.AsyncEngine`` satisfies :class:`EngineClient`; the server
depends on this protocol only, so tests can serve a fake engine. The tokenizer is
``specserve.loading.tokenizer.Tokenizer``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from specserve.engine.outputs import RequestOutput
from specserve.sampling_params import SamplingParams

# One streamed step of one request: the engine's own dataclass (its fields only grow).
EngineOutput = RequestOutput


class EngineClient(Protocol):
    tokenizer: Any  # a loading.tokenizer.Tokenizer, or None for token-id-only engines
    arch: Any  # the target's ArchConfig (vocab_size)
    model_name: str
    max_model_len: int

    def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[EngineOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> Any: ...

    async def shutdown(self, drain: bool = True) -> None: ...
