"""Engine-side configuration: frozen dataclasses, validated in ``__post_init__``.

Each component receives only the sub-config it needs. Boundary inputs (HTTP bodies, CLI,
bench/tune specs) are pydantic models elsewhere and are converted into these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    import torch

DType = Literal["float32", "bfloat16", "float16"]
WeightFormat = Literal["fp32", "bf16", "int8", "int4", "gguf"]
WEIGHT_FORMATS: tuple[WeightFormat, ...] = get_args(WeightFormat)
SpecMethod = Literal["none", "draft", "ngram", "suffix", "hybrid", "eagle", "medusa"]
SPEC_METHODS: tuple[SpecMethod, ...] = (
    "none", "ngram", "suffix", "draft", "hybrid", "eagle", "medusa",
)  # fmt: skip
# Methods that draft with a trained head over the target's hidden states (``draft_model`` is
# the head's directory or name).
HEAD_METHODS: tuple[SpecMethod, ...] = ("eagle", "medusa")


QUANTISED_FORMATS: tuple[WeightFormat, ...] = ("int8", "int4", "gguf")


def check_device(device: str | torch.device, *, available: bool = True) -> torch.device:
    """``device`` as a torch device, if this process can use it (``available=False``: only
    that it is a well-formed CPU or CUDA device, e.g. for a configuration rendered on one
    machine to run on another).

    Raises:
        ValueError: a malformed device string, or one this torch build or machine lacks
            (a CUDA device where torch sees none, an index past the last GPU).
    """
    import torch  # here: the configuration is read by processes that never load torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"invalid device {device!r}: {exc}") from exc
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: only cpu and cuda devices are supported")
    if dev.type == "cpu" or not available:
        return dev
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ValueError(
            f"device {device!r}: torch {torch.__version__} ({build}) sees no CUDA device; "
            "use --device cpu"
        )
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise ValueError(f"device {device!r}: this machine has {count} CUDA device(s)")
    return dev


def resolve_dtype(
    requested: str | None,
    weights: str | None,
    draft_weights: str | None = None,
    device: str = "cpu",
) -> tuple[DType, str | None]:
    """The compute dtype for ``--dtype requested`` (None or ``auto``: choose), and a warning
    for a choice that forgoes the fast path.

    ``auto`` is ``bfloat16`` when the weights (target's or draft's) are int8/int4 on CPU or
    stored as bf16 — the native CPU kernels compute in bf16 only — and ``float32`` otherwise.
    An explicit ``float32`` with int8/int4 weights on CPU is kept, with a warning saying what
    it costs.
    """
    formats = {f for f in (weights, draft_weights) if f is not None}
    quantised = sorted(formats & set(QUANTISED_FORMATS))
    on_cpu = device.split(":")[0] == "cpu"
    if requested in (None, "auto"):
        if (quantised and on_cpu) or weights == "bf16":
            return "bfloat16", None
        return "float32", None
    if requested not in get_args(DType):
        raise ValueError(f"unknown dtype {requested!r}; known: auto, {', '.join(get_args(DType))}")
    warning = None
    if requested == "float32" and quantised and on_cpu:
        warning = (
            f"--dtype float32 with {'/'.join(quantised)} weights: the native CPU kernels compute "
            "in bfloat16 only, so these weights run on PyTorch's dequantising fallback, many "
            "times slower; drop --dtype (auto) or pass --dtype bfloat16"
        )
    return requested, warning  # type: ignore[return-value]


@dataclass(frozen=True)
class ModelConfig:
    """Which model to load and how.

    Attributes:
        model: catalog name, local HF directory, local ``.gguf`` file or HF repo id.
        dtype: compute dtype of activations and (for fp32/bf16 formats) weights.
        device: torch device string (``cpu``, ``cuda``, ``cuda:1``).
        max_model_len: context limit in tokens; None takes the model's own limit.
        weights: storage format of linear weights (``int8``/``int4`` are weight-only).
    """

    model: str
    dtype: DType = "float32"
    device: str = "cpu"
    max_model_len: int | None = None
    weights: WeightFormat | None = None

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must be a non-empty name or path")
        check_device(self.device, available=False)
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache sizing.

    Attributes:
        block_size: tokens per KV block.
        num_blocks: explicit number of blocks; None derives it from ``memory_bytes``.
        memory_bytes: KV cache budget in bytes (used when ``num_blocks`` is None).
        enable_prefix_caching: reuse committed full blocks across requests with equal prefixes.
    """

    block_size: int = 16
    num_blocks: int | None = None
    memory_bytes: int = 1 << 30
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2, got {self.num_blocks}")
        if self.memory_bytes <= 0:
            raise ValueError(f"memory_bytes must be > 0, got {self.memory_bytes}")


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous-batching limits.

    Attributes:
        max_num_seqs: most requests running in one step.
        max_num_batched_tokens: token budget of one step (prefill chunks + decode + drafts).
        max_queue_len: waiting requests beyond this are refused (HTTP 429).
    """

    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    max_queue_len: int = 256

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 16:
            raise ValueError(
                f"max_num_batched_tokens must be >= 16, got {self.max_num_batched_tokens}"
            )
        if self.max_queue_len < 0:
            raise ValueError(f"max_queue_len must be >= 0, got {self.max_queue_len}")


# A draft model stops drafting after a token it drafted with a lower top probability
# (``SpecConfig.draft_confidence_threshold``); chosen by replaying recorded traces
# (benchmarks/k_replay.py, docs/benchmarks.md).
DEFAULT_DRAFT_CONFIDENCE_THRESHOLD = 0.6


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding settings.

    Attributes:
        method: ``none`` (plain decoding), ``draft`` (small model), ``ngram`` (prompt lookup)
            ``suffix`` (suffix matching over prompt and earlier outputs), ``hybrid`` (suffix
            drafts when confident, the draft model otherwise), ``eagle`` (an EAGLE-3 head over
            the target's hidden states) or ``medusa`` (Medusa heads over its last hidden
            state).
        draft_model: the draft's catalog name or path (methods ``draft`` and ``hybrid``), or
            the head's directory or name (methods ``eagle`` and ``medusa``).
        num_speculative_tokens: fixed k; None lets the k controller choose per request.
        k_max: upper bound for the adaptive controller.
        ngram_min: shortest n-gram the prompt-lookup proposer matches.
        ngram_max: longest n-gram the prompt-lookup proposer matches.
        draft_num_layers: keep only the draft's first N layers (a cheaper, weaker draft).
        disable_by_batch_size: no drafting in steps with at least this many requests (None:
            never disabled; the adaptive k still weighs the batch's measured verify cost).
        draft_weights: the draft's weight format; None takes the target's (``ModelConfig``).
            A quantised draft (``int4``) next to a bf16 target is the cheap-draft setting:
            output stays the target's, only acceptance can drop.
        draft_confidence_threshold: a draft model stops drafting for a request after a token
            it drafted with a top probability below this (the token is kept); 0 drafts all k.
            Output is unchanged either way.
    """

    method: SpecMethod = "none"
    draft_model: str | None = None
    num_speculative_tokens: int | None = None
    k_max: int = 8
    ngram_min: int = 2
    ngram_max: int = 4
    draft_num_layers: int | None = None
    draft_weights: WeightFormat | None = None
    disable_by_batch_size: int | None = None
    draft_confidence_threshold: float = DEFAULT_DRAFT_CONFIDENCE_THRESHOLD

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(f"unknown speculative method {self.method!r}")
        if self.uses_draft_model and not self.draft_model:
            raise ValueError(f"speculative method {self.method!r} needs draft_model")
        if self.uses_head and not self.draft_model:
            raise ValueError(
                f"speculative method {self.method!r} needs a trained head (draft_model: its "
                "directory or name; `specserve train-draft` makes one)"
            )
        if not (self.uses_draft_model or self.uses_head) and self.draft_model:
            raise ValueError(f"draft_model given but method is {self.method!r}")
        if self.draft_num_layers is not None and (
            not self.uses_draft_model or self.draft_num_layers < 1
        ):
            raise ValueError(
                f"draft_num_layers={self.draft_num_layers} needs a draft model and must be >= 1"
            )
        if self.disable_by_batch_size is not None and self.disable_by_batch_size < 1:
            raise ValueError(
                f"disable_by_batch_size must be >= 1, got {self.disable_by_batch_size}"
            )
        if self.draft_weights is not None:
            if not self.uses_draft_model:
                raise ValueError(f"draft_weights given but method is {self.method!r}")
            if self.draft_weights not in WEIGHT_FORMATS:
                raise ValueError(f"unknown draft weight format {self.draft_weights!r}")
        if not 0.0 <= self.draft_confidence_threshold < 1.0:
            raise ValueError(
                "draft_confidence_threshold must be in [0, 1), got "
                f"{self.draft_confidence_threshold}"
            )
        k = self.num_speculative_tokens
        if k is not None and not (0 <= k <= 32):
            raise ValueError(f"num_speculative_tokens must be in [0, 32], got {k}")
        if not (1 <= self.k_max <= 32):
            raise ValueError(f"k_max must be in [1, 32], got {self.k_max}")
        if not (1 <= self.ngram_min <= self.ngram_max):
            raise ValueError(
                f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}"
            )

    @property
    def uses_draft_model(self) -> bool:
        """Whether a second decoder drafts (``draft_model`` is a model)."""
        return self.method in ("draft", "hybrid")

    @property
    def draft_stops_itself(self) -> bool:
        """Whether a draft model ends its drafts after an unsure token (the k controller then
        models draft lengths from it: ``KController.confidence_stop``)."""
        return self.uses_draft_model and self.draft_confidence_threshold > 0

    @property
    def uses_head(self) -> bool:
        """Whether a trained head drafts (``draft_model`` is a head directory or name)."""
        return self.method in HEAD_METHODS

    @property
    def enabled(self) -> bool:
        return self.method != "none" and self.num_speculative_tokens != 0

    @property
    def adaptive(self) -> bool:
        return self.enabled and self.num_speculative_tokens is None


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs, one sub-config per component."""

    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    spec: SpecConfig = field(default_factory=SpecConfig)
    seed: int = 0
