"""``specserve serve``: the OpenAI-compatible HTTP server (FastAPI + uvicorn).

The server binds first and loads the model in the background: ``/health`` (liveness) is 200
at once, ``/v1/models`` and ``/ready`` answer 503 until the model is loaded. Kubernetes
startup/readiness probes should poll ``/v1/models``. SIGTERM (or Ctrl-C) stops accepting
connections, lets in-flight requests finish, drains the engine and exits 0. A model that
fails to load makes the command exit 1. Logs go to stderr.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Sequence
from typing import Any

from specserve.commands.vllm_spec import parse_speculative_config
from specserve.config import (
    DEFAULT_DRAFT_CONFIDENCE_THRESHOLD,
    SPEC_METHODS,
    WEIGHT_FORMATS,
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpecConfig,
    SpecMethod,
    WeightFormat,
    check_device,
    resolve_dtype,
)

logger = logging.getLogger(__name__)


class _RecordGiven(argparse.Action):
    """Store the value and remember that the flag was given (its default may look alike):
    specserve's own speculation flags conflict with ``--speculative-config``."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        given = set(getattr(namespace, "spec_flags_given", ()))
        namespace.spec_flags_given = given | {self.option_strings[0]}


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from ``"2GiB"``, ``"512M"``, ``"1.5g"`` or a plain integer (binary units)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 2GiB, 512MiB, 1073741824)")
    size = int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])
    if size <= 0:
        raise argparse.ArgumentTypeError(f"size must be > 0, got {text!r}")
    return size


def parse_k(text: str) -> int | None:
    """``auto`` (None: the adaptive controller) or a fixed k in [0, 32]."""
    if text == "auto":
        return None
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None
    if not 0 <= k <= 32:
        raise argparse.ArgumentTypeError(f"num-speculative-tokens must be in [0, 32], got {k}")
    return k


def add_weight_format_args(p: argparse.ArgumentParser, weights_help: str) -> None:
    """``--weights`` (the target's format) and ``--draft-weights`` (the draft's own)."""
    p.add_argument(
        "--weights",
        choices=WEIGHT_FORMATS,
        help=f"{weights_help}; gguf: a quantised GGUF file's blocks computed as stored, the "
        "default for one on CPU unless --dtype is float32/float16",
    )
    p.add_argument(
        "--draft-weights",
        choices=WEIGHT_FORMATS,
        help="the draft's weight format (default: int4 beside a gguf or bf16 target where the "
        "native int4 kernels run, i.e. on CPU in bf16; otherwise --weights, where gguf means "
        "the draft's own default)",
    )


def add_draft_confidence_arg(p: argparse.ArgumentParser) -> None:
    """``--draft-confidence-threshold`` (``SpecConfig.draft_confidence_threshold``)."""
    p.add_argument(
        "--draft-confidence-threshold",
        type=float,
        default=DEFAULT_DRAFT_CONFIDENCE_THRESHOLD,
        metavar="P",
        help="a draft model stops drafting after a token it drafted with a top probability "
        "below P; output is unchanged (default %(default)s; 0 drafts all k)",
    )


def implied_spec_method(spec_method: SpecMethod | None, draft_model: str | None) -> SpecMethod:
    """``--spec-method`` as given, else ``draft`` when ``--draft-model`` is, else ``none``."""
    return spec_method or ("draft" if draft_model else "none")


def default_weights(model: str, device: str, dtype: str | None) -> WeightFormat | None:
    """The target's format when ``--weights`` is not given (``gguf`` for a quantised GGUF
    file on CPU, see ``loading/gguf_stored.default_format``)."""
    from specserve.loading.gguf_stored import default_format  # heavy: only when it runs

    return default_format(model, device, dtype)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run the OpenAI-compatible server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="catalog name, HF dir, .gguf file or repo id")
    p.add_argument(
        "--draft-model",
        action=_RecordGiven,
        help="draft model (implies --spec-method draft), or for eagle/medusa the trained "
        "head's directory or name (`specserve train-draft`)",
    )
    p.add_argument(
        "--spec-method",
        action=_RecordGiven,
        choices=list(SPEC_METHODS),
        help="speculative method (default: draft if --draft-model is given, else none); "
        "eagle: an EAGLE-3 head over the target's hidden states; medusa: Medusa heads",
    )
    p.add_argument(
        "--num-speculative-tokens",
        action=_RecordGiven,
        type=parse_k,
        default=None,
        metavar="K|auto",
        help="fixed draft length k, or 'auto' for the adaptive controller (default auto)",
    )
    p.add_argument(
        "--speculative-config",
        metavar="JSON",
        help='speculation as vLLM spells it, e.g. \'{"method": "ngram", '
        '"num_speculative_tokens": 4, "prompt_lookup_max": 3}\' or \'{"model": DRAFT, '
        '"num_speculative_tokens": 5}\' or \'{"method": "eagle3", "model": HEAD_DIR}\'; '
        "instead of --spec-method, --draft-model, "
        "--num-speculative-tokens and --speculative-disable-by-batch-size (keys: method, "
        "model, num_speculative_tokens, "
        "prompt_lookup_min/max, disable_by_batch_size; draft_tensor_parallel_size and "
        "max_model_len are ignored)",
    )
    p.add_argument("--k-max", type=int, default=8, help="largest k the controller may choose")
    p.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="compute dtype; auto: bfloat16 for int8/int4/gguf or bf16 weights on CPU (the "
        "native kernels' dtype), else float32",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-model-len", type=int, default=None, help="context limit in tokens")
    p.add_argument("--max-num-seqs", type=int, default=16, help="most requests per step")
    p.add_argument(
        "--max-num-batched-tokens", type=int, default=2048, help="token budget of one step"
    )
    p.add_argument(
        "--max-queue-len", type=int, default=256, help="waiting requests beyond this get 429"
    )
    p.add_argument(
        "--kv-cache-memory", type=parse_size, default=1 << 30, help="KV cache budget, e.g. 2GiB"
    )
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    add_weight_format_args(
        p,
        "weight format (int8/int4: weight-only, quantised once and cached); default: gguf "
        "or the dtype's float weights",
    )
    p.add_argument(
        "--speculative-disable-by-batch-size",
        action=_RecordGiven,
        type=int,
        default=None,
        metavar="N",
        help="no drafting in steps with at least N requests (large batches are compute bound; "
        "default: never, the adaptive k alone decides)",
    )
    add_draft_confidence_arg(p)
    p.add_argument(
        "--draft-num-layers",
        type=int,
        help="keep only the draft's first N layers (a cheaper, weaker draft)",
    )
    p.add_argument("--served-model-name", help="name clients use in 'model' (default --model)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run)


def spec_config_from_args(args: argparse.Namespace) -> SpecConfig:
    """Speculation from specserve's flags or from vLLM's ``--speculative-config``
    (ValueError if invalid, or if both are given)."""
    vllm_json = getattr(args, "speculative_config", None)
    if vllm_json is None:
        method = implied_spec_method(args.spec_method, args.draft_model)
        return SpecConfig(
            method=method,
            draft_model=args.draft_model,
            num_speculative_tokens=args.num_speculative_tokens,
            k_max=args.k_max,
            draft_num_layers=args.draft_num_layers,
            draft_weights=args.draft_weights,
            disable_by_batch_size=args.speculative_disable_by_batch_size,
            draft_confidence_threshold=args.draft_confidence_threshold,
        )
    given = sorted(set(getattr(args, "spec_flags_given", ())))
    if given:
        raise ValueError(
            f"--speculative-config and {', '.join(given)} both configure speculation; "
            "give either vLLM's --speculative-config or specserve's flags"
        )
    vllm = parse_speculative_config(vllm_json)
    for warning in vllm.warnings:
        logger.warning("%s", warning)
    defaults = SpecConfig()
    return SpecConfig(
        method=vllm.method,
        draft_model=vllm.draft_model,
        num_speculative_tokens=vllm.num_speculative_tokens,
        k_max=args.k_max,
        ngram_min=vllm.ngram_min or defaults.ngram_min,
        ngram_max=vllm.ngram_max or defaults.ngram_max,
        draft_num_layers=args.draft_num_layers,
        draft_weights=args.draft_weights,
        disable_by_batch_size=vllm.disable_by_batch_size,
        draft_confidence_threshold=args.draft_confidence_threshold,
    )


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The engine configuration an argument namespace asks for (ValueError if invalid)."""
    if args.weights is None:
        args.weights = default_weights(args.model, args.device, args.dtype)
    dtype, warning = resolve_dtype(args.dtype, args.weights, args.draft_weights, args.device)
    if warning:
        logger.warning("%s", warning)
    return EngineConfig(
        model=ModelConfig(
            model=args.model,
            dtype=dtype,
            device=args.device,
            max_model_len=args.max_model_len,
            weights=args.weights,
        ),
        cache=CacheConfig(block_size=args.block_size, memory_bytes=args.kv_cache_memory),
        scheduler=SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_queue_len=args.max_queue_len,
        ),
        spec=spec_config_from_args(args),
        seed=args.seed,
    )


def _drained_exit_server(config: Any) -> Any:
    """A uvicorn server whose SIGTERM ends with exit status 0 once draining is done.

    uvicorn shuts down gracefully on SIGTERM and then re-raises the signal, so the process
    would die with -15; for a server that drained every request, 0 is the truthful status
    (orchestrators log non-zero exits as failures). SIGINT keeps uvicorn's behaviour.
    """
    import signal

    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM and sig in self._captured_signals:
                self._captured_signals.remove(sig)

    return DrainingServer(config)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from specserve.engine.async_engine import AsyncEngine
    from specserve.server.app import create_app

    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = engine_config_from_args(args)
        check_device(args.device)  # before the server starts (the loader checks it again)
    except ValueError as exc:
        print(f"specserve serve: {exc}", file=sys.stderr)
        return 2
    served_name = args.served_model_name or args.model
    failed: list[BaseException] = []
    server: Any = None

    def on_load_failure(exc: BaseException) -> None:
        failed.append(exc)
        if server is not None:
            server.should_exit = True

    app = create_app(
        served_model_name=served_name,
        engine_factory=lambda: AsyncEngine.from_config(config),
        on_load_failure=on_load_failure,
    )
    uv_config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.log_level == "debug",
        timeout_keep_alive=30,
    )
    server = _drained_exit_server(uv_config)
    logger.info("binding %s:%d, loading %s in the background", args.host, args.port, args.model)
    server.run()
    if failed:
        logger.error("exiting: model failed to load: %s", failed[0])
        return 1
    return 0
