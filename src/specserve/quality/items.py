"""What a quality task is made of: items to ask, and a score for each answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol


class QualityTaskUnavailable(RuntimeError):
    """A quality task's package is not installed (the message names it)."""


@dataclass(frozen=True)
class Item:
    """One question, sent identically to every arm.

    Attributes:
        item_id: stable id (``HumanEval/20``, ``exact/3``).
        endpoint: ``chat`` (the prompt is the one user message) or ``completions``.
        prompt: the text sent.
        max_tokens: the request's max_tokens (temperature is always 0).
        stop: stop strings of the request.
        reference: the expected answer, or for code the tests (recorded with the results).
    """

    item_id: str
    endpoint: Literal["chat", "completions"]
    prompt: str
    max_tokens: int
    stop: tuple[str, ...] = ()
    reference: str = ""


@dataclass(frozen=True)
class Score:
    passed: bool
    detail: str


class Task(Protocol):
    """A quality task: its items and how an answer is scored."""

    name: str
    description: str
    items: list[Item]

    def score(self, item: Item, answer: str) -> Score: ...

    def pass_rate(self, outcomes: list[bool]) -> float: ...
