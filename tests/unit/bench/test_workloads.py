"""Prompt suites, JSONL prompt files and llmperf-mode prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specserve.bench.inputs import LlmperfConfig, WorkloadConfig
from specserve.bench.suites import SUITES, builtin_lines, load_jsonl
from specserve.bench.workloads import (
    estimate_tokens,
    llmperf_prompts,
    load_workload,
    prompt_set_hash,
)


def test_builtin_suites_have_their_categories() -> None:
    prompts = load_workload(WorkloadConfig())
    cats = {p.category for p in prompts}
    assert {"repeat", "counting", "json", "report", "code"} <= cats
    assert {"prose", "explanation"} <= cats
    assert len({p.id for p in prompts}) == len(prompts)
    # categories interleaved: the first seven requests cover all seven categories
    assert len({p.category for p in prompts[:7]}) == 7


def test_category_filter_and_unknown_category() -> None:
    prompts = load_workload(WorkloadConfig(suites=("structured",), categories=("repeat",)))
    assert prompts and {p.category for p in prompts} == {"repeat"}
    with pytest.raises(ValueError, match="not in the workload"):
        load_workload(WorkloadConfig(suites=("structured",), categories=("prose",)))


def test_unknown_suite_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown suite 'nope': use a registered suite"):
        load_workload(WorkloadConfig(suites=("nope",)))


def test_every_registered_suite_can_be_benchmarked_together() -> None:
    prompts = load_workload(WorkloadConfig(suites=tuple(SUITES)))
    assert {"palindrome", "json-template", "mixed-0", "brief-0", "repeat-0"} <= {
        p.id for p in prompts
    }


def test_user_jsonl(tmp_path: Path) -> None:
    f = tmp_path / "mine.jsonl"
    lines = [{"prompt": "hi there", "category": "greet", "max_tokens": 7}, {"prompt": "yo"}]
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    prompts = load_workload(WorkloadConfig(suites=(str(f),)))
    assert [p.category for p in prompts] == ["greet", "mine"]
    assert prompts[0].max_tokens == 7 and prompts[1].id == "mine-2"


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("not json\n", "mine.jsonl:1"),
        ('{"text": ""}\n', "mine.jsonl:1"),
        ("[1]\n", "JSON object"),
        ('{"id": 3}\n', "prompt"),
        ("\n", "no prompts"),
    ],
)
def test_bad_jsonl_names_the_line(tmp_path: Path, content: str, match: str) -> None:
    f = tmp_path / "mine.jsonl"
    f.write_text(content)
    with pytest.raises(ValueError, match=match):
        load_jsonl(f)


def test_duplicate_ids_refused(tmp_path: Path) -> None:
    f = tmp_path / "dup.jsonl"
    f.write_text('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n')
    with pytest.raises(ValueError, match="not unique"):
        load_workload(WorkloadConfig(suites=(str(f),)))


def test_llmperf_prompts_hit_the_input_token_target() -> None:
    spec = LlmperfConfig(
        mean_input_tokens=300, stddev_input_tokens=0, mean_output_tokens=77, num_prompts=5, seed=1
    )
    prompts = llmperf_prompts(spec)
    assert len(prompts) == 5
    for p in prompts:
        assert p.text.startswith("Randomly stream lines from the following text with 77 output")
        assert estimate_tokens(p.text) == pytest.approx(300, abs=3)
        assert p.max_tokens == 77 and p.category == "llmperf"
        body = p.text.split("\n\n", 1)[1].splitlines()
        assert all(any(line in src for src in builtin_lines()) for line in body[:-1])
    assert prompts == llmperf_prompts(spec)  # seeded
    assert prompts != llmperf_prompts(spec.model_copy(update={"seed": 2}))


def test_llmperf_stddev_varies_lengths() -> None:
    spec = LlmperfConfig(mean_input_tokens=200, stddev_input_tokens=50, num_prompts=20)
    lengths = {estimate_tokens(p.text) for p in llmperf_prompts(spec)}
    assert len(lengths) > 5


def test_prompt_set_hash_changes_with_content() -> None:
    a = load_workload(WorkloadConfig(suites=("structured",)))
    assert prompt_set_hash(a) == prompt_set_hash(list(a))
    assert prompt_set_hash(a) != prompt_set_hash(a[:-1])


def test_estimate_tokens() -> None:
    assert estimate_tokens("Hello, world! 42") == 5
    assert estimate_tokens("   ") == 0
