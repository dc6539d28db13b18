"""``specserve generate``: one prompt, batch 1, plain or speculative decoding.

Prints the text, prefill and decode speed, and for speculation the acceptance rate, the
mean acceptance length and (``--compare-plain``) the decode speedup over plain decoding of
the same prompt, measured in the same run.
"""

from __future__ import annotations

import argparse
import sys

from specserve.commands.serve import (
    add_draft_confidence_arg,
    add_weight_format_args,
    default_weights,
    implied_spec_method,
    parse_k,
)
from specserve.config import SPEC_METHODS, SpecConfig, resolve_dtype
from specserve.dtypes import torch_dtype
from specserve.sampling_params import SamplingParams
from specserve.spec_decode.draft_model import check_vocab_compatible
from specserve.spec_decode.factory import make_proposer
from specserve.spec_decode.k_controller import KController
from specserve.spec_decode.plain_loop import GenerationResult, generate_plain
from specserve.spec_decode.speculative_loop import SpecGenerationResult, generate_speculative

K_MAX_DEFAULT = 8


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text for one prompt (plain or speculative), with speed and acceptance",
        description="Batch-1 generation with plain or speculative decoding.",
    )
    p.add_argument("--model", required=True, help="target: catalog name, .gguf file or HF dir")
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    p.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass kept")
    p.add_argument("--top-k", type=int, default=0, help="most likely tokens kept (0 = all)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed")
    p.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="compute dtype; auto: bfloat16 for int8/int4/gguf or bf16 weights (the native CPU "
        "kernels' dtype), else float32",
    )
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1)")
    add_weight_format_args(
        p, "the target's weight format (int8/int4: weight-only, --dtype activations)"
    )
    p.add_argument(
        "--spec-method",
        choices=list(SPEC_METHODS),
        default=None,
        help="speculative method (default: draft if --draft-model is given, else none, as in "
        "`specserve serve`)",
    )
    p.add_argument(
        "--draft-model",
        default=None,
        help="draft model (implies --spec-method draft; also for 'hybrid'), or the trained "
        "head (eagle, medusa)",
    )
    p.add_argument(
        "--num-speculative-tokens",
        type=parse_k,
        default=None,
        metavar="K|auto",
        help="draft tokens per step, or 'auto' for the adaptive controller (default auto)",
    )
    p.add_argument("--k-max", type=int, default=K_MAX_DEFAULT, help="largest adaptive k")
    add_draft_confidence_arg(p)
    p.add_argument("--compare-plain", action="store_true", help="also run plain decoding")
    p.set_defaults(func=run)


def _report(label: str, res: GenerationResult) -> None:
    print(
        f"[{label}] {len(res.token_ids)} tokens ({res.finish_reason}); "
        f"prefill {res.num_prompt_tokens} tokens at {res.prefill_tokens_per_s:.1f} tok/s; "
        f"decode {res.decode_tokens_per_s:.2f} tok/s"
    )
    if isinstance(res, SpecGenerationResult) and res.k_history:
        s = res.stats
        per_pos = ", ".join(f"{a:.2f}" for a in s.acceptance_rate_per_pos())
        print(
            f"[{label}] acceptance rate {s.acceptance_rate:.3f}, mean acceptance length "
            f"{s.mean_acceptance_length:.2f}, drafts {s.num_drafts}, target forwards "
            f"{res.num_target_forwards}, mean k {sum(res.k_history) / len(res.k_history):.2f}; "
            f"per position [{per_pos}]"
        )
        print(
            f"[{label}] k per step: {run_lengths(res.k_history)}; draft {res.draft_s:.2f} s, "
            f"verify {res.verify_s:.2f} s"
        )


def run_lengths(values: list[int]) -> str:
    """``[0, 1, 0, 0, 0]`` -> ``"0 1 0x3"``: a k history, each run of one value shortened."""
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        out.append(f"{values[i]}x{j - i}" if j - i > 1 else str(values[i]))
        i = j
    return " ".join(out)


def run(args: argparse.Namespace) -> int:
    from specserve.loading.gguf_stored import draft_format  # heavy: only when they run
    from specserve.loading.quant_cache import load_in_format

    try:
        params = SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_tokens=args.max_tokens,
            seed=args.seed,
        )
        spec = SpecConfig(
            method=implied_spec_method(args.spec_method, args.draft_model),
            draft_model=args.draft_model,
            num_speculative_tokens=args.num_speculative_tokens,
            k_max=max(args.k_max, args.num_speculative_tokens or 1),
            draft_weights=args.draft_weights,
            draft_confidence_threshold=args.draft_confidence_threshold,
        )
        if args.weights is None:
            args.weights = default_weights(args.model, args.device, args.dtype)
        dtype_name, warning = resolve_dtype(
            args.dtype, args.weights, args.draft_weights, args.device
        )
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
        dtype = torch_dtype(dtype_name)
        target = load_in_format(args.model, args.weights, dtype, args.device)
        tok = target.tokenizer
        prompt_ids = (
            tok.encode_chat([{"role": "user", "content": args.prompt}])
            if args.chat
            else tok.encode(args.prompt)
        )
        eos = tuple(tok.eos_token_ids)
        proposer = None
        if spec.enabled:
            draft, head = None, None
            if spec.uses_head:
                from specserve.engine.builder import load_head

                assert spec.draft_model is not None
                head = load_head(spec.method, spec.draft_model, target.model, args.device)
            if spec.uses_draft_model:
                assert spec.draft_model is not None
                draft_lm = load_in_format(
                    spec.draft_model,
                    draft_format(
                        args.draft_weights, args.weights, spec.draft_model, args.device, dtype_name
                    ),
                    dtype,
                    args.device,
                )
                check_vocab_compatible(
                    target.arch.vocab_size, draft_lm.arch.vocab_size, tok, draft_lm.tokenizer
                )
                draft = draft_lm.model
            max_len = len(prompt_ids) + params.max_tokens + spec.k_max + 1
            proposer = make_proposer(
                spec.method,
                target.arch.vocab_size,
                draft,
                max_model_len=max_len,
                ngram_min=spec.ngram_min,
                ngram_max=spec.ngram_max,
                target=target.model,
                head=head,
                head_name=spec.draft_model or "",
                confidence_threshold=spec.draft_confidence_threshold,
            )
    except (ValueError, OSError, RuntimeError, MemoryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    def detok(ids: list[int]) -> str:
        return tok.decode(ids)

    results: dict[str, GenerationResult] = {}
    if proposer is None or args.compare_plain:
        results["plain"] = generate_plain(target.model, prompt_ids, params, eos)
    if proposer is not None:
        k: int | KController = (
            spec.num_speculative_tokens
            if spec.num_speculative_tokens is not None
            else KController(spec.k_max, confidence_stop=spec.draft_stops_itself)
        )
        results[spec.method] = generate_speculative(
            target.model, proposer, prompt_ids, params, eos, k, detokenize=detok
        )
    shown = results[spec.method] if proposer is not None else results["plain"]
    print(tok.decode(shown.token_ids))
    print("---")
    for label, res in results.items():
        _report(label, res)
    if proposer is not None and "plain" in results:
        plain, sp = results["plain"], results[spec.method]
        speedup = (
            sp.decode_tokens_per_s / plain.decode_tokens_per_s if plain.decode_tokens_per_s else 0.0
        )
        same = "identical" if sp.token_ids == plain.token_ids else "DIFFERENT"
        print(f"speedup vs plain (decode tok/s): {speedup:.2f}x; output {same} to plain")
    return 0
