"""The prompt-suite registry: every named prompt set of specserve, in one place.

A *suite* is a list of :class:`Prompt`, each with a *category* (the unit of per-category
tables). Each suite is the JSONL file ``<name>.jsonl`` next to this module, one prompt per
line: ``{"prompt": str, "category": str?, "id": str?, "max_tokens": int?}`` (the format of
user prompt files too, see :func:`load_jsonl`). Prompt ids are unique across all suites, so
any suites can be benchmarked together.

Suites (:data:`SUITES`):

- ``structured`` / ``open-ended``: the suites of ``specserve bench``, ``experiment`` and
  ``tune`` (outputs a drafter can predict: repeat, counting, json, report, code / outputs it
  cannot: prose, explanation).
- ``mini-structured`` / ``mini-open-ended``: 4 and 6 short prompts for slow in-process batch-1
  runs (``benchmarks/speculative_batch1.py``, ``benchmarks/k_replay.py``).
- ``perf``: the prompts of ``specserve perf --prompts`` (category ``open`` or ``structured``).
- ``mixed``: 8 prompts of mixed kinds (``python -m specserve.perf.engine_batching``).
- ``brief``: 8 one-line questions (``benchmarks/batch_cost.py``).

``lines.txt`` (:func:`builtin_lines`) is the line file of the llmperf-style suite, whose prompts
are generated (``specserve.bench.workloads.llmperf_prompts``).

Pure Python and data: ``specserve bench`` speaks HTTP only, so nothing here may import torch,
the engine, the server or the models.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

SUITES: dict[str, str] = {
    "structured": "outputs a drafter can predict: repeat, counting, json, report, code",
    "open-ended": "outputs a drafter cannot predict: prose, explanation",
    "mini-structured": "4 short structured prompts for in-process batch-1 benchmarks",
    "mini-open-ended": "6 short open-ended prompts for in-process batch-1 benchmarks",
    "perf": "the prompts of `specserve perf` (palindrome, fizzbuzz, cat, json)",
    "mixed": "8 prompts of mixed kinds for the engine batching benchmark",
    "brief": "8 one-line questions for the batch step-cost benchmark",
}
"""Suite name -> what its prompts are."""


class UnknownSuiteError(ValueError):
    """A suite name (or a prompt id of a suite) that the registry does not have."""


class Prompt(BaseModel):
    """One prompt of a suite."""

    id: str = Field(description="Stable id, unique within the workload (used to pair arms).")
    category: str = Field(default="default", description="Category for per-category statistics.")
    text: str = Field(min_length=1, description="User message (chat) or prompt (completions).")
    max_tokens: int | None = Field(
        default=None, ge=1, description="Overrides the run's max_tokens."
    )


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


def suite_names() -> tuple[str, ...]:
    """The registered suite names, in :data:`SUITES` order."""
    return tuple(SUITES)


def get_suite(name: str) -> list[Prompt]:
    """The prompts of the registered suite ``name`` (a fresh list, in file order)."""
    if name not in SUITES:
        raise UnknownSuiteError(f"unknown suite {name!r}; registered: {', '.join(SUITES)}")
    ref = resources.files(__name__) / f"{name}.jsonl"
    with resources.as_file(ref) as path:
        return load_jsonl(path, default_category=name)


def get_prompts(suite: str, ids: Sequence[str]) -> list[Prompt]:
    """The prompts of ``suite`` with these ids, in the order given."""
    by_id = {p.id: p for p in get_suite(suite)}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        raise UnknownSuiteError(
            f"unknown prompt {unknown[0]!r} in suite {suite!r}; choose from {list(by_id)}"
        )
    return [by_id[i] for i in ids]


def builtin_lines() -> list[str]:
    """The non-empty lines of the built-in llmperf line file (original verse)."""
    ref = resources.files(__name__) / "lines.txt"
    return [ln for ln in ref.read_text(encoding="utf-8").splitlines() if ln.strip()]
