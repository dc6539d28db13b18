"""The exact-answer task: generated arithmetic and string questions with one correct answer.

Why generated rather than a published set: nothing can be downloaded at run time here, and a
generator ships in a few lines, gives the same items on every run and machine for a seed
(``random.Random`` seeded with a string is stable across Python versions), has exactly one
correct answer by construction, and needs no judge model. Short answers keep it cheap, and
digits and word order are where a wrongly accepted draft token would show.

Five kinds of question, taken in turn: the sum of two 3-digit numbers, the difference of a
3-digit and a smaller number, a 2-digit number times a 1-digit one, five numbers sorted
ascending (comma-separated) and four words in reverse order (space-separated).

Scoring is exact match after :func:`normalise` on both the answer and the reference: take the
last non-empty line (models sometimes restate the question first); drop a leading ``answer:``
or ``the answer is``; strip whitespace, Markdown emphasis and code marks (``*``, `` ` ``),
quotes and a trailing period; lower-case; one space after each comma and none before it;
runs of whitespace become one space; and when the reference is a single integer, commas and
spaces between digits go (``1,234`` is ``1234``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from specserve.quality.config import ExactConfig
from specserve.quality.items import Item, Score

WORDS = (
    "apple", "river", "stone", "cloud", "green", "table", "music", "light", "house", "paper",
    "ocean", "tiger", "bread", "chair", "smile", "train", "water", "plant", "clock", "glass",
)  # fmt: skip
INSTRUCTION = "Reply with the answer only: no words, no explanation."


def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(100, 999), rng.randint(100, 999)
    return f"What is {a} + {b}?", str(a + b)


def _subtract(rng: random.Random) -> tuple[str, str]:
    a = rng.randint(100, 999)
    b = rng.randint(10, a - 1)
    return f"What is {a} - {b}?", str(a - b)


def _multiply(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(12, 99), rng.randint(3, 9)
    return f"What is {a} * {b}?", str(a * b)


def _sort(rng: random.Random) -> tuple[str, str]:
    nums = rng.sample(range(1, 100), 5)
    shown = ", ".join(map(str, nums))
    return (
        f"Sort these numbers in ascending order, separated by commas: {shown}.",
        ", ".join(map(str, sorted(nums))),
    )


def _reverse_words(rng: random.Random) -> tuple[str, str]:
    words = rng.sample(WORDS, 4)
    return (
        f"Write these words in reverse order, separated by spaces: {' '.join(words)}.",
        " ".join(reversed(words)),
    )


KINDS: tuple[Callable[[random.Random], tuple[str, str]], ...] = (
    _add,
    _subtract,
    _multiply,
    _sort,
    _reverse_words,
)


def generate(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """``count`` (question, answer) pairs; item i depends only on (seed, i)."""
    return [KINDS[i % len(KINDS)](random.Random(f"{seed}:{i}")) for i in range(count)]


_PREFIX = re.compile(r"^(?:the\s+)?answer(?:\s+is)?\s*[:=]?\s*", re.I)
_INTEGER = re.compile(r"-?\d+")


def normalise(text: str, integer: bool = False) -> str:
    """The form answers and references are compared in (see the module docstring)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    s = lines[-1] if lines else ""
    s = _PREFIX.sub("", s.strip())
    s = s.strip().strip("*`\"' ").rstrip(".").strip("*`\"' ")
    s = s.lower()
    s = re.sub(r"\s*,\s*", ", ", s)
    s = re.sub(r"\s+", " ", s).strip()
    if integer:
        s = re.sub(r"(?<=\d)[, ]+(?=\d)", "", s)
    return s


class ExactTask:
    """The exact-answer task (see the module docstring)."""

    name = "exact"

    def __init__(self, cfg: ExactConfig) -> None:
        self.description = (
            f"{cfg.count} generated arithmetic and string questions (seed {cfg.seed}), "
            "exact match after normalisation"
        )
        self.items = [
            Item(
                item_id=f"exact/{i}",
                endpoint=cfg.endpoint,
                prompt=f"{question} {INSTRUCTION}",
                max_tokens=cfg.max_tokens,
                reference=answer,
            )
            for i, (question, answer) in enumerate(generate(cfg.count, cfg.seed))
        ]

    def score(self, item: Item, answer: str) -> Score:
        integer = bool(_INTEGER.fullmatch(item.reference))
        got = normalise(answer, integer)
        passed = got == normalise(item.reference, integer)
        return Score(passed, "exact match" if passed else f"got {got[:80]!r}")

    def pass_rate(self, outcomes: list[bool]) -> float:
        return sum(outcomes) / len(outcomes) if outcomes else 0.0
