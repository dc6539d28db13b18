"""Prompt suites: built-in structured / open-ended suites, user JSONL files, llmperf mode.

A *suite* is a list of prompts, each with a *category* (the unit of per-category tables):
``structured`` (repeat, counting, json, report, code: outputs a drafter can predict) and
``open-ended`` (prose, explanation: outputs it cannot). User files are JSONL with one object
per line: ``{"prompt": str, "category": str?, "id": str?, "max_tokens": int?}``.

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
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from specserve.bench.inputs import LlmperfSpec, WorkloadSpec

BUILTIN_SUITES = ("structured", "open-ended")
_WORD_PIECES = re.compile(r"\w+|[^\w\s]")


class Prompt(BaseModel):
    """One prompt of a suite."""

    id: str = Field(description="Stable id, unique within the workload (used to pair arms).")
    category: str = Field(default="default", description="Category for per-category statistics.")
    text: str = Field(min_length=1, description="User message (chat) or prompt (completions).")
    max_tokens: int | None = Field(
        default=None, ge=1, description="Overrides the run's max_tokens."
    )


def estimate_tokens(text: str) -> int:
    """Approximate token count of ``text``: words and punctuation marks (≈ BPE tokens)."""
    return len(_WORD_PIECES.findall(text))


def load_jsonl(path: str | Path, default_category: str | None = None) -> list[Prompt]:
    """Read a JSONL prompt file; raises ValueError naming the bad line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompt file not found: {path}")
    category = default_category or path.stem
    prompts: list[Prompt] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            text = obj.get("prompt", obj.get("text"))
            if not isinstance(text, str):
                raise ValueError("needs a string 'prompt'")
            prompts.append(
                Prompt(
                    id=str(obj.get("id", f"{path.stem}-{lineno}")),
                    category=str(obj.get("category", category)),
                    text=text,
                    max_tokens=obj.get("max_tokens"),
                )
            )
        except (ValueError, ValidationError) as e:
            raise ValueError(f"{path}:{lineno}: bad prompt line ({e})") from e
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def builtin_suite(name: str) -> list[Prompt]:
    """One of :data:`BUILTIN_SUITES`."""
    if name not in BUILTIN_SUITES:
        raise ValueError(f"unknown suite {name!r}; built-in: {', '.join(BUILTIN_SUITES)}")
    ref = resources.files("specserve.bench") / "suites" / f"{name}.jsonl"
    with resources.as_file(ref) as path:
        return load_jsonl(path, default_category=name)


def builtin_lines() -> list[str]:
    ref = resources.files("specserve.bench") / "suites" / "lines.txt"
    return [ln for ln in ref.read_text(encoding="utf-8").splitlines() if ln.strip()]


def llmperf_prompts(spec: LlmperfSpec) -> list[Prompt]:
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


def load_workload(spec: WorkloadSpec) -> list[Prompt]:
    """All prompts of ``spec``, categories interleaved round-robin; ids must be unique."""
    prompts: list[Prompt] = []
    for suite in spec.suites:
        if suite == "llmperf":
            prompts += llmperf_prompts(spec.llmperf)
        elif suite in BUILTIN_SUITES:
            prompts += builtin_suite(suite)
        elif suite.endswith(".jsonl") or Path(suite).is_file():
            prompts += load_jsonl(suite)
        else:
            raise ValueError(
                f"unknown suite {suite!r}: use {', '.join(BUILTIN_SUITES)}, llmperf, or a .jsonl"
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
