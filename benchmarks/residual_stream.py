"""The fused layers' residual stream in fp32 against bf16: accuracy and step time.

``--part accuracy`` (the default): how far the served numbers are from fp32 activations, in
per-token log-likelihood and logits. The reference is the same model file with fp32
activations on its fp32-dequantised weights (``--weights fp32``; for ``--weights bf16``
those weights rounded to bf16 first, so that only the activations differ). Against it, the
served path (``--weights gguf``, ``bf16`` or ``int4``, bf16 activations on the fused layer
ops) with the residual stream in fp32 (the default) and in bf16
(``SPECSERVE_FP32_RESIDUAL=0``, the eager module's roundings), the eager bf16 module
where the format has one (``bf16``), and where the Q4_K matmuls take int8 activations
(``int4_native.int8_activations``) the same path with bf16 ones
(``SPECSERVE_INT8_ACTIVATIONS=0``), and where the fused layers' attention scores keys in lanes
(``csrc/key_lanes.h``, AVX-512 BF16 builds) the same path with the scores as fp32 chains
(``SPECSERVE_BF16_SCORES=0``), and where that attention runs on the AMX tiles
(``csrc/attention_tiles.h``) the same path on the vector units (``SPECSERVE_ATTENTION_AMX=0``).
For each it prints the mean log-likelihood per token
and its difference from the reference with the difference's standard error (a text of n
tokens measures a mean shift only to about std / sqrt(n)), the mean absolute per-token
difference, the relative error of the logits and the mean KL divergence from the reference.
``int4`` re-quantises the weights, so its difference includes that change of model.

Without ``--text`` the text is ``specserve perf``'s held-out one (116 tokens).

``--part activations``: what rounding the matmuls' inputs alone costs, on the reference model
itself (fp32-dequantised weights, fp32 activations): every linear layer's input rounded to
bf16, or to int8 with one scale (max |x| / 127) per group of 32 inputs (as Q8_0 stores
blocks), or per 256 (as llama.cpp's Q8_K quantises activations for its K-quant dot
products), each against the unrounded reference. It sizes what a kernel multiplying int8
activations (``vpdpbusd``, twice the products per instruction of ``vdpbf16ps``) would cost in
accuracy.

``--part step``: the served model's decode step (1 new token) and verify step (5) at a
200-token context with the stream in fp32 and in bf16, alternating on the same model for
``--rounds`` rounds of 20 steps each; medians in ms.

    python benchmarks/residual_stream.py --weights gguf
    python benchmarks/residual_stream.py --weights gguf --tokens 2000 \\
        --text "$(python -c 'import textwrap; print(textwrap.__file__)')"
    python benchmarks/residual_stream.py --part step --weights gguf --rounds 5
    python benchmarks/residual_stream.py --part activations --tokens 2000 \\
        --text "$(python -c 'import textwrap; print(textwrap.__file__)')"

Run the step part alone on the machine: it measures time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.loading.quant_cache import load_model_with_weights
from specserve.models.decoder import DecoderLM
from specserve.models.native import fused_layer, int4_native
from specserve.perf.report import HELD_OUT_TEXT


def _logits(model: DecoderLM, ids: list[int]) -> torch.Tensor:
    """fp32 logits of every position but the last, ``# [T - 1, vocab]``."""
    cache = SingleSequenceCache(model, len(ids) + 1)
    return model.compute_logits(cache.forward(ids[:-1])).float()


@dataclass
class Against:
    """A path's numbers against the reference's, over the same tokens."""

    mean_ll: float
    shift: float  # mean per-token log-likelihood difference (path - reference)
    shift_se: float  # its standard error
    mean_abs: float  # mean |per-token difference|
    logit_rel: float  # ||logits - reference|| / ||reference||
    kl: float  # mean KL(reference || path) per position


def compare(ref_logits: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> Against:
    ref_lp, lp = torch.log_softmax(ref_logits, -1), torch.log_softmax(logits, -1)
    ref_tok = ref_lp.gather(-1, targets[:, None]).squeeze(-1)
    tok = lp.gather(-1, targets[:, None]).squeeze(-1)
    diff = tok - ref_tok
    kl = (ref_lp.exp() * (ref_lp - lp)).sum(-1).mean()
    return Against(
        mean_ll=float(tok.mean()),
        shift=float(diff.mean()),
        shift_se=float(diff.std() / len(diff) ** 0.5),
        mean_abs=float(diff.abs().mean()),
        logit_rel=float((logits - ref_logits).norm() / ref_logits.norm()),
        kl=float(kl),
    )


def _use(model: DecoderLM, fp32_stream: bool) -> None:
    os.environ["SPECSERVE_FP32_RESIDUAL"] = "1" if fp32_stream else "0"
    fused_layer.enable(model)  # plans the layers again, reading the switch


def step_times(args: argparse.Namespace) -> None:
    served = load_model_with_weights(args.model, args.weights, dtype=torch.bfloat16)
    model = served.model
    _use(model, True)
    print(f"{args.model} {args.weights}, {fused_layer.describe(model)}; medians of {args.rounds}")
    times: dict[tuple[bool, int], list[float]] = {}
    for _ in range(args.rounds):
        for fp32_stream in (True, False):
            _use(model, fp32_stream)
            for rows in (1, 5):
                cache = SingleSequenceCache(model, 512)
                cache.forward(list(range(100, 300)))
                t0 = time.perf_counter()
                for i in range(20):
                    model.compute_logits(cache.forward([5 + i] * rows)[-1:])
                ms = (time.perf_counter() - t0) / 20 * 1e3
                times.setdefault((fp32_stream, rows), []).append(ms)
    print("| residual stream | 1-token step (ms) | 5-token step (ms) |")
    print("|---|---|---|")
    for fp32_stream in (True, False):
        one, five = (statistics.median(times[(fp32_stream, r)]) for r in (1, 5))
        print(f"| {'fp32' if fp32_stream else 'bf16'} | {one:.1f} | {five:.1f} |")


def rounded_input(x: torch.Tensor, rounding: tuple[str, int]) -> torch.Tensor:
    """``x # [..., K]`` rounded as ``rounding`` says: ``("bf16", 0)``, or ``("int8", G)``
    (symmetric, one fp32 scale max |x| / 127 per group of G inputs)."""
    kind, group = rounding
    if kind == "bf16":
        return x.to(torch.bfloat16).to(x.dtype)
    shape = x.shape
    xs = x.reshape(*shape[:-1], shape[-1] // group, group)
    scale = xs.abs().amax(-1, keepdim=True) / 127
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return (torch.round(xs / scale).clamp(-127, 127) * scale).reshape(shape)


ROUNDINGS = (("bf16", 0), ("int8", 32), ("int8", 256))


def activations(model: DecoderLM, ids: list[int], ref: torch.Tensor, ref_ll: float) -> None:
    """``model`` (the reference) again with every linear layer's input rounded, each
    :data:`ROUNDINGS` against ``ref``, its unrounded logits (the hooks stay on ``model``)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    current: list[tuple[str, int]] = []

    def hook(_: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return (rounded_input(args[0], current[0]), *args[1:])

    for m in linears:
        m.register_forward_pre_hook(hook)
    targets = torch.tensor(ids[1:])
    print(f"every input of the {len(linears)} linear layers rounded, fp32 weights otherwise")
    print("| input rounding | log-likelihood | vs reference | ± s.e. | logits rel. error | KL |")
    print("|---|---|---|---|---|---|")
    for rounding in ROUNDINGS:
        current[:] = [rounding]
        a = compare(ref, _logits(model, ids), targets)
        pct, se = 100 * a.shift / abs(ref_ll), 100 * a.shift_se / abs(ref_ll)
        name = "bf16" if rounding[0] == "bf16" else f"int8, a scale per {rounding[1]} inputs"
        print(
            f"| {name} | {a.mean_ll:.4f} | {pct:+.3f} % | {se:.3f} % | {a.logit_rel:.2e} "
            f"| {a.kl:.1e} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", default="accuracy", choices=["accuracy", "step", "activations"])
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--weights", default="gguf", choices=["gguf", "bf16", "int4"])
    p.add_argument("--text", type=Path, help="a text file (default: perf's held-out text)")
    p.add_argument("--tokens", type=int, default=0, help="use the first N tokens (0: all)")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    if args.part == "step":
        step_times(args)
        return
    text = args.text.read_text() if args.text else HELD_OUT_TEXT

    t0 = time.perf_counter()
    ref_model = load_model_with_weights(args.model, "fp32", dtype=torch.float32)
    if args.weights == "bf16":
        with torch.no_grad():
            for param in ref_model.model.parameters():
                param.copy_(param.to(torch.bfloat16).float())
    ids = list(ref_model.tokenizer.encode(text, add_special_tokens=False))
    if args.tokens:
        ids = ids[: args.tokens]
    ref = _logits(ref_model.model, ids)
    targets = torch.tensor(ids[1:])
    ref_ll = float(torch.log_softmax(ref, -1).gather(-1, targets[:, None]).mean())
    print(
        f"{args.model}, {len(ids)} tokens of {args.text.name if args.text else 'the held-out text'}"
    )
    took = time.perf_counter() - t0
    print(f"reference (fp32 activations): log-likelihood {ref_ll:.4f} ({took:.0f} s)")
    if args.part == "activations":
        activations(ref_model.model, ids, ref, ref_ll)
        return
    del ref_model

    served = load_model_with_weights(args.model, args.weights, dtype=torch.bfloat16)
    paths: list[tuple[str, bool | None]] = [("fp32 residual", True), ("bf16 residual", False)]
    if args.weights == "bf16":
        paths.append(("eager bf16 module", None))
    if int4_native.int8_activations():  # the Q4_K matmuls' bf16-activation kernel too
        paths.append(("fp32 residual, bf16 activations", True))
    if torch.ops.specserve.fused_attention_tiles(served.model.cfg.head_dim):  # AMX tiles
        paths.append(("fp32 residual, attention on the vector units", True))
    if torch.ops.specserve.fused_bf16_scores(served.model.cfg.head_dim):  # keys in lanes
        paths.append(("fp32 residual, fp32-chain scores", True))
    print(
        "| path | log-likelihood | vs reference | ± s.e. | mean abs. per token "
        "| logits rel. error | KL |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, fp32_stream in paths:
        if fp32_stream is None:
            fused_layer.disable(served.model)
        else:
            _use(served.model, fp32_stream)
        os.environ["SPECSERVE_INT8_ACTIVATIONS"] = "0" if "bf16 activations" in name else "1"
        os.environ["SPECSERVE_BF16_SCORES"] = "0" if "fp32-chain scores" in name else "1"
        os.environ["SPECSERVE_ATTENTION_AMX"] = "0" if "vector units" in name else "1"
        desc = fused_layer.describe(served.model)
        a = compare(ref, _logits(served.model, ids), targets)
        pct, se = 100 * a.shift / abs(ref_ll), 100 * a.shift_se / abs(ref_ll)
        print(
            f"| {args.weights} {name} ({desc}) | {a.mean_ll:.4f} | {pct:+.3f} % | {se:.3f} % "
            f"| {a.mean_abs:.4f} | {a.logit_rel:.2e} | {a.kl:.1e} |"
        )
    os.environ.pop("SPECSERVE_FP32_RESIDUAL", None)
    os.environ.pop("SPECSERVE_INT8_ACTIVATIONS", None)
    os.environ.pop("SPECSERVE_BF16_SCORES", None)
    os.environ.pop("SPECSERVE_ATTENTION_AMX", None)


if __name__ == "__main__":
    main()
