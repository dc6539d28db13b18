"""Tables of ``specserve perf``: speed per arm and prompt, ratios, achieved bandwidth, and
quantisation quality (greedy exact match, mean log-likelihood difference)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specserve.kv_cache.single_sequence import SingleSequenceCache
from specserve.models.decoder import DecoderLM
from specserve.perf.arms import ArmResult, paired_ratio
from specserve.spec_decode.replay import common_prefix

# Held-out text for the log-likelihood comparison (written for this benchmark).
HELD_OUT_TEXT = (
    "def merge_intervals(intervals):\n"
    '    """Merge overlapping [start, end] pairs and return them sorted."""\n'
    "    result = []\n"
    "    for start, end in sorted(intervals):\n"
    "        if result and start <= result[-1][1]:\n"
    "            result[-1][1] = max(result[-1][1], end)\n"
    "        else:\n"
    "            result.append([start, end])\n"
    "    return result\n\n"
    "The lighthouse keeper wrote in his log that the fog had lifted before noon, that two "
    "fishing boats had come back early, and that the lamp needed a new wick by Friday.\n"
)


def common_prefix_fraction(a: list[int], b: list[int]) -> float:
    """Share of ``b``'s tokens that ``a`` reproduces before the first difference."""
    return common_prefix(a, b) / max(len(b), 1)


@torch.inference_mode()
def mean_log_likelihood(model: DecoderLM, ids: list[int]) -> float:
    """Mean log-probability per token of ``ids[1:]`` given the preceding tokens."""
    cache = SingleSequenceCache(model, len(ids) + 1)
    logits = model.compute_logits(cache.forward(ids[:-1]))  # [T-1, vocab]
    logp = torch.log_softmax(logits.float(), dim=-1)
    target = torch.tensor(ids[1:]).unsqueeze(-1)
    return float(logp.gather(-1, target).mean())


@dataclass
class Quality:
    fmt: str
    exact_match: float  # prompts whose greedy output equals the reference's
    prefix_fraction: float  # mean share of reference tokens reproduced before a difference


def quality_vs(plain_by_fmt: dict[str, ArmResult], ref: str) -> list[Quality]:
    base = plain_by_fmt[ref]
    out = []
    for fmt, arm in plain_by_fmt.items():
        if fmt == ref:
            continue
        pairs = list(zip(arm.token_ids, base.token_ids, strict=True))
        exact = sum(a == b for a, b in pairs) / len(pairs)
        prefix = sum(common_prefix_fraction(a, b) for a, b in pairs) / len(pairs)
        out.append(Quality(fmt, exact, prefix))
    return out


def _reference_for(arm: ArmResult, plain_by_fmt: dict[str, ArmResult]) -> ArmResult | None:
    for fmt, plain in plain_by_fmt.items():
        if arm.name.startswith(f"specserve {fmt} "):
            return plain
    return plain_by_fmt.get("bf16")


def _plain_row(results: list[ArmResult], engine: str) -> ArmResult | None:
    """The first measured plain row of another engine (``llama.cpp``, ``vllm``)."""
    return next(
        (
            r
            for r in results
            if r.name.startswith(f"{engine} ") and r.name.endswith(" plain") and not r.error
        ),
        None,
    )


def print_paired_ratios(
    results: list[ArmResult], names: list[str], plain_by_fmt: dict[str, ArmResult]
) -> None:
    """With ``--rounds`` > 1: each arm against the specserve plain arm it alternated with (its
    group's), and, where llama.cpp's arms alternated with ours, each arm of that group against
    llama.cpp plain too: from the ratios within the rounds (the arms of a prompt run back to
    back), the median over adjacent rounds of their geometric mean (``paired_ratio``), which a
    host's drifting speed moves less than the ratio of medians in the table."""
    llama = _plain_row(results, "llama.cpp")
    references = [("plain of its format", lambda r: plain_by_fmt.get(r.group))]
    if llama is not None and llama.round_tok_per_s:
        references.append(("llama.cpp plain", lambda r: llama if r.group == llama.group else None))
    for label, reference in references:
        rows = []
        for r in results:
            ref = reference(r)
            if r.error or ref is None or ref is r or not r.round_tok_per_s:
                continue
            cells = [paired_ratio(r, ref, i) for i in range(len(names))]
            row = " | ".join(f"{c:.2f}" if c else "-" for c in cells)
            rows.append(f"| {r.name} | {row} |")
        if not rows:
            continue
        rounds = len(next(r for r in results if r.round_tok_per_s).round_tok_per_s[0])
        print()
        how = "the ratio" if rounds == 1 else f"median over {rounds} rounds of adjacent pairs"
        print(f"× {label}, {how} (arms back to back, order reversed each round):")
        print("| arm | " + " | ".join(names) + " |")
        print("\n".join(rows))


def print_table(
    results: list[ArmResult],
    names: list[str],
    kinds: list[str],
    bandwidth_gbs: float,
    plain_by_fmt: dict[str, ArmResult],
) -> None:
    """One row per arm; per prompt: decode tok/s, ×bf16 plain, ×llama.cpp plain (×vLLM plain
    too when a vllm row ran), tokens per target forward, output == the same format's plain
    output (specserve) or bf16's."""
    ratios: list[tuple[str, ArmResult | None]] = [
        ("bf16", plain_by_fmt.get("bf16")),
        ("llama", _plain_row(results, "llama.cpp")),
    ]
    vllm = _plain_row(results, "vllm")
    if vllm is not None:
        ratios.append(("vllm", vllm))
    columns = " ".join(f"×{label}" for label, _ in ratios)
    print()
    head = " | ".join(
        f"{n} ({k}): tok/s {columns} tok/fwd same" for n, k in zip(names, kinds, strict=True)
    )
    print(f"| arm | {head} | achieved BW |")
    for r in results:
        if r.error:
            print(f"| {r.name} | NOT RUN: {r.error} |")
            continue
        cells = []
        ref = _reference_for(r, plain_by_fmt)
        for i in range(len(names)):
            tps = r.tok_per_s(i)
            xs = " ".join(
                f"{tps / base.tok_per_s(i):.2f}" if base and base.tok_per_s(i) else "-"
                for _, base in ratios
            )
            tpf = r.tokens_per_forward(i)
            same = (
                "-"
                if ref is None or ref is r
                else (
                    "yes"
                    if r.token_ids[i] == ref.token_ids[i]
                    else f"{common_prefix_fraction(r.token_ids[i], ref.token_ids[i]):.0%}"
                )
            )
            cells.append(f"{tps:.1f} {xs} {f'{tpf:.2f}' if tpf else '-'} {same}")
        bw = "-"
        if r.bytes_per_token:
            mean_tps = sum(r.tok_per_s(i) for i in range(len(names))) / len(names)
            gbs = r.bytes_per_token * mean_tps / 1e9
            bw = (
                f"{gbs:.1f} GB/s = {gbs / bandwidth_gbs:.0%} ({r.bytes_per_token / 1e9:.2f} GB/tok)"
            )
        print(f"| {r.name} | " + " | ".join(cells) + f" | {bw} |")


def print_quality(quality: list[Quality], results: list[ArmResult]) -> None:
    del results
    print()
    for q in quality:
        print(
            f"quality {q.fmt} vs bf16 (plain greedy, these prompts): exact match "
            f"{q.exact_match:.0%}, tokens before first difference {q.prefix_fraction:.0%}"
        )
