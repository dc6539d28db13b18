"""Per-request sampling parameters.

Temperature 0 means greedy decoding, explicitly: no sampling kernel runs and top-k/top-p are
ignored (they cannot change an argmax). Everything here is validated at construction so that
the engine never sees a value it cannot honour.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Most alternatives a request may ask for per token (``top_logprobs`` / ``logprobs``), as
# OpenAI's chat API and vLLM's default ``max_logprobs``.
MAX_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the sampler and of the stop logic.

    Attributes:
        temperature: 0 selects greedy decoding; > 0 divides the logits before softmax.
        top_p: nucleus mass kept, in (0, 1]; 1 disables it.
        top_k: number of most likely tokens kept; 0 (or -1 from OpenAI clients) disables it.
        max_tokens: upper bound on generated tokens (>= 1).
        min_tokens: EOS and stop ids are suppressed until this many tokens were generated.
        stop: strings that end generation; the stop string itself is not returned.
        stop_token_ids: extra token ids that end generation (returned like EOS is not).
        ignore_eos: keep generating past EOS (benchmarks that need fixed output lengths).
        seed: per-request seed; the same seed gives the same samples whatever the batch.
        num_speculative_tokens: fixed draft length k for this request (0 = no speculation),
            overriding the server's controller; at most the server's k_max. None: the
            server decides (a specserve extension, used by ``specserve tune``).
        logprobs: per generated token, return its log-probability and this many most likely
            alternatives (0..MAX_LOGPROBS); None computes nothing. Values are those of the
            target model's raw distribution: log-softmax of its fp32 logits before
            temperature, top-k/top-p and min_tokens masking (vLLM's default
            ``raw_logprobs``), whether the token came from a plain step or a verified draft.
        prompt_logprobs: the same for every prompt token after the first (None: nothing);
            such a request is prefilled without the prefix cache, so every prompt position
            is computed.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    min_tokens: int = 0
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    seed: int | None = None
    num_speculative_tokens: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (or -1 to disable), got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        k = self.num_speculative_tokens
        if k is not None and not 0 <= k <= 32:
            raise ValueError(f"num_speculative_tokens must be in [0, 32], got {k}")
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and not 0 <= n <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {n}")

    @property
    def greedy(self) -> bool:
        """True when decoding is deterministic argmax (temperature 0)."""
        return self.temperature == 0.0
