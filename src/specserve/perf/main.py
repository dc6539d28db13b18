"""The run of ``specserve perf``: CPU decode speed of specserve (each weight format, plain /
speculative / fused), transformers (plain, assisted), llama.cpp (plain, prompt lookup) and
vLLM (bf16 plain, draft model; only with ``--arms ...,vllm``) on the same prompts, plus
memory bandwidth, achieved bandwidth, peak memory and quantisation quality. The prompts are
the registry suite ``perf`` (specserve.bench.suites).

All arms run in one invocation on the same machine; ratios are taken inside the run. Arms
that cannot run (llama_cpp, transformers or vllm missing) are printed with the reason.
"""

from __future__ import annotations

import argparse
import logging
import resource
import sys
import time
from pathlib import Path
from typing import Any, cast

import torch

from specserve.bench.suites import UnknownSuiteError, get_prompts
from specserve.config import DEFAULT_DRAFT_CONFIDENCE_THRESHOLD, WeightFormat
from specserve.models.decoder import DecoderLM
from specserve.perf.arms import (
    ArmFailed,
    ArmResult,
    InProcessArm,
    fused_arm,
    hf_from_decoder,
    measure_bandwidth_gbs,
    plain_arm,
    run_interleaved,
    run_transformers,
    spec_arm,
)
from specserve.perf.options import ARM_GROUPS, PROMPT_SUITE
from specserve.perf.report import (
    HELD_OUT_TEXT,
    mean_log_likelihood,
    print_paired_ratios,
    print_quality,
    print_table,
    quality_vs,
)
from specserve.perf.worker_arms import (
    count_bytes,
    llamacpp_arms,
    llamacpp_loglik,
    llamacpp_names,
    run_llamacpp,
    run_vllm,
    start_llamacpp,
)
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.factory import make_proposer
from specserve.spec_decode.plain_loop import GenerationResult

logger = logging.getLogger(__name__)


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)


def run(args: argparse.Namespace) -> int:
    """Run the arms of ``args`` (flags: :func:`specserve.perf.options.add_arguments`)."""
    from specserve.loading import CATALOG
    from specserve.loading.quant_cache import load_model_with_weights
    from specserve.loading.transport import fetch
    from specserve.models.fast_path import FastPathOptions, optimize_for_decode
    from specserve.models.native import fused_layer

    formats = [w for w in args.weights.split(",") if w]
    names = [n for n in args.prompts.split(",") if n]
    arms_wanted = {a for a in args.arms.split(",") if a}
    unknown = sorted(arms_wanted - set(ARM_GROUPS))
    if unknown:
        print(
            f"unknown arm group(s) {', '.join(unknown)}; known: {', '.join(ARM_GROUPS)}",
            file=sys.stderr,
        )
        return 2
    try:
        chosen = get_prompts(PROMPT_SUITE, names)
    except UnknownSuiteError as e:
        print(e, file=sys.stderr)
        return 2
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    fast = FastPathOptions(
        compile=args.compile, invariant_context_bucket=args.context_bucket or None
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    if args.profile:
        from specserve.perf.profile import profile_decode

        for fmt in formats:
            lm = load_model_with_weights(args.target, fmt)  # type: ignore[arg-type]
            profile_decode(lm.model, f"{args.target} {fmt}", compile=args.compile)
            del lm
        return 0

    # Read bandwidth varies with the host's load over minutes: read it before, between and
    # after the arms and take the best as the limit (the share of it is then conservative).
    bandwidth = [measure_bandwidth_gbs()]
    results = _ProgressList()
    plain_by_fmt: dict[str, ArmResult] = {}
    prompts: list[list[int]] = []
    eos: tuple[int, ...] = ()
    loglik: dict[str, float] = {}
    held_out_ids: list[int] = []
    gguf = llama_file = None
    if "llamacpp" in arms_wanted:
        gguf = fetch(CATALOG[args.target]) if args.target in CATALOG else Path(args.target)
    for i, fmt in enumerate(formats):
        t0 = time.perf_counter()
        target = load_model_with_weights(args.target, fmt)  # type: ignore[arg-type]
        draft_fmt = draft_format_beside(args.draft_weights, fmt, args.draft)
        draft = load_model_with_weights(args.draft, draft_fmt)
        load_s = time.perf_counter() - t0
        optimize_for_decode(target.model, fast)
        optimize_for_decode(draft.model, fast)
        # as the engine builder does
        fused_layer.set_draft(draft.model)
        if not prompts:
            prompts = [
                target.tokenizer.encode_chat([{"role": "user", "content": p.text}]) for p in chosen
            ]
            eos = tuple(target.tokenizer.eos_token_ids)
        tm, dm = target.model, draft.model
        in_process = _in_process_arms(fmt, tm, dm, arms_wanted, args.k, params, eos, draft_fmt)
        held_out_ids = list(target.tokenizer.encode(HELD_OUT_TEXT, add_special_tokens=False))
        # llama.cpp reads the same file as gguf: its arms alternate with gguf's, its plain
        # right after ours (a worker process kept alive for the rounds)
        worker = None
        if gguf is not None and fmt == "gguf":
            llama_file, gguf = gguf, None  # measured here, not on its own after the formats
            try:
                worker = start_llamacpp(args.llama_python, llama_file, threads)
            except ArmFailed as e:
                results += [ArmResult(n, error=str(e)) for n in llamacpp_names(llama_file)]
            else:
                plain, lookup = llamacpp_arms(worker, llama_file, args.max_tokens, eos)
                in_process[1:1] = [plain]
                in_process.append(lookup)
        try:
            measured = run_interleaved(in_process, prompts, args.rounds, on_run=_print_run)
            if worker is not None:
                llamacpp_loglik(worker, held_out_ids, loglik)
        finally:
            if worker is not None:
                worker.close()
        for arm in measured:
            arm.group = fmt
        plain_by_fmt[fmt] = measured[0]
        results += measured
        loglik[fmt] = mean_log_likelihood(tm, held_out_ids)
        if i == 0:
            print(
                f"peak RSS after loading target+draft ({fmt}) and decoding: "
                f"{_rss_gib():.2f} GiB (load {load_s:.1f} s)"
            )
        if fmt == "bf16" and "transformers" in arms_wanted:
            # transformers shares our float weights; a quantised draft has none, so its arms
            # get the draft in bf16 (their assisted generation drafts with the same model)
            hf_draft = dm if draft_fmt == "bf16" else load_model_with_weights(args.draft).model
            hf_pair = (hf_from_decoder(tm), hf_from_decoder(hf_draft))
            results += _transformers_arms(hf_pair, prompts, args.max_tokens, eos)
            del hf_pair, hf_draft
        del target, draft, tm, dm, in_process  # the arms hold the models
    if llama_file is not None:  # alternated with gguf's arms
        count_bytes(results, llama_file)
    if "transformers" in arms_wanted and "bf16" not in formats:
        results.append(ArmResult("transformers", error="needs bf16 in --weights"))
    # After the models: the 1 GiB buffer must not count in the peak RSS printed above.
    bandwidth.append(measure_bandwidth_gbs())
    if gguf is not None:  # no gguf arms to alternate with: llama.cpp's rounds on their own
        llama = run_llamacpp(
            args.llama_python,
            gguf,
            prompts,
            args.max_tokens,
            eos,
            threads,
            loglik_ids=held_out_ids,
            loglik=loglik,
            rounds=args.rounds,
        )
        for arm in llama:
            arm.group = "llama.cpp"
        results += llama
        bandwidth.append(measure_bandwidth_gbs())
    if "vllm" in arms_wanted:
        results += run_vllm(
            args.vllm_python,
            args.vllm_model_dir,
            args.vllm_draft_dir,
            prompts,
            args.max_tokens,
            eos,
            threads,
            args.k,
        )
    from specserve.models.native import huge_pages

    bw = max(bandwidth)
    pages = "huge pages" if huge_pages.available() else "4 KiB pages"
    print(
        f"memory read bandwidth: {bw:.1f} GB/s, the best of {len(bandwidth)} readings "
        f"({', '.join(f'{b:.1f}' for b in bandwidth)}: before loading, after the specserve arms"
        f"{', after llama.cpp' if len(bandwidth) > 2 else ''}; each the best of 5 sums over "
        f"1 GiB in {pages}); threads {threads}"
    )

    print_table(results, names, [p.category for p in chosen], bw, plain_by_fmt)
    if args.rounds > 1:
        print_paired_ratios(results, names, plain_by_fmt)
    if "bf16" in plain_by_fmt:
        print_quality(quality_vs(plain_by_fmt, "bf16"), results)
    print_loglik(loglik)
    return 0


def print_loglik(loglik: dict[str, float]) -> None:
    """Mean log-likelihood per token of the held-out text per format (and llama.cpp's),
    beside the reference: fp32 (the GGUF dequantised in fp32) if it ran, else bf16."""
    ref = "fp32" if "fp32" in loglik else "bf16" if "bf16" in loglik else None
    parts = []
    for name, value in loglik.items():
        if ref is None or name == ref:
            parts.append(f"{name} {value:.4f}")
            continue
        rel = (value - loglik[ref]) / abs(loglik[ref]) if loglik[ref] else 0.0
        parts.append(f"{name} {value:.4f} (Δ {value - loglik[ref]:+.4f}, {rel:+.3%} vs {ref})")
    print("mean log-likelihood per token of the held-out text: " + ", ".join(parts))


def draft_format_beside(draft_weights: WeightFormat | None, fmt: str, draft: str) -> WeightFormat:
    """The draft's format in the arms of target format ``fmt``: ``--draft-weights``, else
    what ``serve`` picks beside such a target (``loading.gguf_stored.draft_format``: int4
    beside a gguf or bf16 target where the native int4 kernels run), else ``fmt``."""
    from specserve.loading.gguf_stored import draft_format
    from specserve.loading.quant_cache import compute_dtype_for

    target = cast("WeightFormat", fmt)
    dtype = str(compute_dtype_for(target, None)).removeprefix("torch.")
    return draft_format(draft_weights, target, draft, "cpu", dtype) or target


def load_gguf_pair(target: str, draft: str) -> tuple[Any, Any, WeightFormat]:
    """``(target, draft, draft format)``: serve's default pair on a GGUF file, set up as the
    engine builder sets it up: the target in the ``gguf`` format, the draft in the format
    serve picks beside it (:func:`draft_format_beside`), both optimised for decode and the
    draft marked as one (``fused_layer.set_draft``). Both models are ``LoadedModel`` objects."""
    from specserve.loading.quant_cache import load_model_with_weights
    from specserve.models.fast_path import optimize_for_decode
    from specserve.models.native import fused_layer

    loaded_target = load_model_with_weights(target, "gguf")
    fmt = draft_format_beside(None, "gguf", draft)
    loaded_draft = load_model_with_weights(draft, fmt)
    for lm in (loaded_target, loaded_draft):
        optimize_for_decode(lm.model)
    fused_layer.set_draft(loaded_draft.model)
    return loaded_target, loaded_draft, fmt


def _in_process_arms(
    fmt: str,
    tm: DecoderLM,
    dm: DecoderLM,
    arms_wanted: set[str],
    k: int,
    params: SamplingParams,
    eos: tuple[int, ...],
    draft_weights: str | None = None,
) -> list[InProcessArm]:
    """The specserve arms of one weight format, plain first; the draft's format is named in
    its arms' labels when it differs from the target's."""
    from specserve.spec_decode import warm_start
    from specserve.spec_decode.k_controller import KController

    arms = [plain_arm(f"specserve {fmt} plain", tm, params, eos)]
    draft = "draft" if draft_weights in (None, fmt) else f"{draft_weights} draft"
    stop = DEFAULT_DRAFT_CONFIDENCE_THRESHOLD > 0

    def with_draft(method: str):  # type: ignore[no-untyped-def]
        """A factory of the draft-model method's proposer (a new one per decode)."""
        return lambda: make_proposer(
            method,
            tm.cfg.vocab_size,
            dm,
            max_model_len=4096,
            confidence_threshold=DEFAULT_DRAFT_CONFIDENCE_THRESHOLD,
        )

    timed: list[float] = []  # the target's step times, measured once for every controller

    def warmed(controller: KController) -> KController:
        """``controller`` seeded with the target's step times, as a new server's is
        (``spec_decode/warm_start.py``), unless ``SPECSERVE_K_WARM_START=0``."""
        if warm_start.enabled():
            if not timed:
                timed.extend(warm_start.time_verify_steps(tm, controller.k_max + 1))
            warm_start.seed(controller, timed)
        return controller

    def adaptive():  # type: ignore[no-untyped-def]
        return warmed(KController(8, confidence_stop=stop))

    if "draft" in arms_wanted:
        factory = with_draft("draft")
        arms.append(spec_arm(f"specserve {fmt} {draft} k={k}", tm, factory, k, params, eos))
        name = f"specserve {fmt} {draft} k=adaptive"
        arms.append(spec_arm(name, tm, factory, adaptive, params, eos))
    if "hybrid" in arms_wanted:
        name = f"specserve {fmt} hybrid {draft} k=adaptive"
        arms.append(spec_arm(name, tm, with_draft("hybrid"), adaptive, params, eos))
    if "ngram" in arms_wanted:
        arms.append(
            spec_arm(
                f"specserve {fmt} ngram k=adaptive",
                tm,
                lambda: make_proposer("ngram", tm.cfg.vocab_size),
                lambda: warmed(KController(8)),
                params,
                eos,
            )
        )
    if "fused" in arms_wanted:
        arms.append(fused_arm(f"specserve {fmt} fused {draft} k={k}", tm, dm, k, params, eos))
    return arms


def _print_run(arm: str, prompt: int, result: GenerationResult) -> None:
    """Each in-process decode as it ends (stderr), so a run cut short leaves its numbers."""
    print(
        f"run {arm}, prompt {prompt}: {result.decode_tokens_per_s:.2f} tok/s",
        file=sys.stderr,
        flush=True,
    )


class _ProgressList(list[ArmResult]):
    """The result rows; each row is also printed to stderr as soon as it is measured, so a
    run cut short still leaves its numbers."""

    def append(self, arm: ArmResult) -> None:
        super().append(arm)
        speeds = ", ".join(f"{arm.tok_per_s(i):.2f}" for i in range(len(arm.token_ids)))
        print(f"measured {arm.name}: tok/s {speeds} {arm.error or ''}", file=sys.stderr, flush=True)

    def __iadd__(self, arms):  # type: ignore[no-untyped-def,override,misc]
        for arm in arms:
            self.append(arm)
        return self


def _transformers_arms(hf_pair, prompts, max_tokens, eos) -> list[ArmResult]:  # type: ignore[no-untyped-def]
    try:
        return [
            run_transformers("transformers bf16 plain", hf_pair[0], prompts, max_tokens, eos),
            run_transformers(
                "transformers bf16 assisted",
                hf_pair[0],
                prompts,
                max_tokens,
                eos,
                assistant=hf_pair[1],
            ),
            run_transformers(
                "transformers bf16 prompt-lookup",
                hf_pair[0],
                prompts,
                max_tokens,
                eos,
                prompt_lookup=4,
            ),
        ]
    except Exception as e:  # report the arm's failure in the table rather than abort the run
        logger.exception("transformers arm failed")
        return [ArmResult("transformers", error=f"{type(e).__name__}: {e}")]
