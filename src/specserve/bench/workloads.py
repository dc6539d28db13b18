"""Workloads of ``specserve bench``: the prompts of registered suites, user JSONL files and
llmperf mode, categories interleaved.

Named suites live in the registry :mod:`specserve.bench.suites` (with the :class:`Prompt` type
and the JSONL format); user files are JSONL with one object per line:
``{"prompt": str, "category": str?, "id": str?, "max_tokens": int?}``.

llmperf mode builds prompts like llmperf's token-benchmark does (so published setups can be
reproduced): a fixed instruction asking to stream lines back, followed by lines drawn at
random from a line file until the prompt reaches a target number of input tokens drawn from
a normal distribution. Token counts use :func:`estimate_tokens` (no tokenizer here), so input
lengths are approximate; the built-in line file is original verse written for this project.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

from specserve.bench.inputs import LlmperfConfig, WorkloadConfig
from specserve.bench.suites import SUITES, Prompt, builtin_lines, get_suite, load_jsonl

# Prompt is defined in the registry; bench's request code takes it from here with the workload.
__all__ = ["Prompt", "estimate_tokens", "llmperf_prompts", "load_workload", "prompt_set_hash"]

_WORD_PIECES = re.compile(r"\w+|[^\w\s]")


def estimate_tokens(text: str) -> int:
    """Approximate token count of ``text``: words and punctuation marks (≈ BPE tokens)."""
    return len(_WORD_PIECES.findall(text))


def llmperf_prompts(spec: LlmperfConfig) -> list[Prompt]:
    """Prompts in llmperf's token-benchmark style (see module docstring)."""
    if spec.lines_file is not None:
        path = Path(spec.lines_file)
        if not path.is_file():
            raise ValueError(f"lines file not found: {path}")
        lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    else:
        lines = builtin_lines()
    if not lines:
        raise ValueError("lines file has no non-empty lines")
    rng = random.Random(spec.seed)
    prompts = []
    for i in range(spec.num_prompts):
        target = max(10, round(rng.gauss(spec.mean_input_tokens, spec.stddev_input_tokens)))
        head = (
            f"Randomly stream lines from the following text with {spec.mean_output_tokens} "
            "output tokens. Don't generate eos tokens:\n\n"
        )
        budget = target - estimate_tokens(head)
        body: list[str] = []
        pool = lines[:]
        rng.shuffle(pool)
        while budget > 0:
            if not pool:
                pool = lines[:]
                rng.shuffle(pool)
            line = pool.pop()
            cost = estimate_tokens(line)
            if cost > budget:  # cut the last line to the remaining budget
                line = " ".join(line.split()[: max(1, budget)])
                cost = budget
            body.append(line)
            budget -= cost
        prompts.append(
            Prompt(
                id=f"llmperf-{i}",
                category="llmperf",
                text=head + "\n".join(body),
                max_tokens=spec.mean_output_tokens,
            )
        )
    return prompts


def load_workload(spec: WorkloadConfig) -> list[Prompt]:
    """All prompts of ``spec``, categories interleaved round-robin; ids must be unique."""
    prompts: list[Prompt] = []
    for suite in spec.suites:
        if suite == "llmperf":
            prompts += llmperf_prompts(spec.llmperf)
        elif suite in SUITES:
            prompts += get_suite(suite)
        elif suite.endswith(".jsonl") or Path(suite).is_file():
            prompts += load_jsonl(suite)
        else:
            raise ValueError(
                f"unknown suite {suite!r}: use a registered suite ({', '.join(SUITES)}), "
                "llmperf, or a .jsonl file"
            )
    if spec.categories is not None:
        keep = set(spec.categories)
        missing = keep - {p.category for p in prompts}
        if missing:
            raise ValueError(f"categories not in the workload: {sorted(missing)}")
        prompts = [p for p in prompts if p.category in keep]
    prompts = _round_robin(prompts)
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError("prompt ids are not unique; give each JSONL line a distinct 'id'")
    return prompts


def _round_robin(prompts: list[Prompt]) -> list[Prompt]:
    """Interleave categories (first of each, then second of each, ...), keeping each
    category's order, so that any prefix of the request sequence covers every category."""
    by_cat: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_cat.setdefault(p.category, []).append(p)
    columns = list(by_cat.values())
    longest = max((len(c) for c in columns), default=0)
    return [c[i] for i in range(longest) for c in columns if i < len(c)]


def prompt_set_hash(prompts: list[Prompt]) -> str:
    """sha256 over the prompts (id, category, text, max_tokens), for the run manifest."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps(p.model_dump(), sort_keys=True).encode())
    return h.hexdigest()
