"""The prompt-suite registry (specserve.bench.suites): every suite loads, ids are unique across
suites, unknown names fail clearly, and the registry stays pure Python and data."""

from __future__ import annotations

import subprocess
import sys
from importlib import resources

import pytest

from specserve.bench.suites import (
    SUITES,
    UnknownSuiteError,
    builtin_lines,
    get_prompts,
    get_suite,
    suite_names,
)


@pytest.mark.parametrize("name", list(SUITES))
def test_every_registered_suite_loads(name: str) -> None:
    prompts = get_suite(name)
    assert prompts and all(p.text.strip() and p.category for p in prompts)
    assert len({p.id for p in prompts}) == len(prompts)


def test_each_suite_is_a_packaged_data_file() -> None:
    files = {f.name for f in resources.files("specserve.bench.suites").iterdir()}
    assert {f"{name}.jsonl" for name in SUITES} | {"lines.txt"} <= files
    assert suite_names() == tuple(SUITES)


def test_prompt_ids_are_unique_across_suites() -> None:
    # So any registered suites can be benchmarked together (load_workload refuses duplicates).
    ids = [p.id for name in SUITES for p in get_suite(name)]
    assert len(set(ids)) == len(ids)


def test_unknown_suite_names_the_registered_ones() -> None:
    with pytest.raises(UnknownSuiteError, match="unknown suite 'nope'; registered: structured"):
        get_suite("nope")


def test_prompts_by_id_keep_the_order_given() -> None:
    assert [p.id for p in get_prompts("perf", ["cat", "palindrome"])] == ["cat", "palindrome"]
    with pytest.raises(UnknownSuiteError, match=r"unknown prompt 'dog' in suite 'perf'.*'cat'"):
        get_prompts("perf", ["cat", "dog"])


def test_the_named_sets_keep_their_prompts() -> None:
    # The prompts that published benchmark figures were measured on (docs/benchmarks.md).
    perf = {p.id: p for p in get_suite("perf")}
    assert list(perf) == ["palindrome", "fizzbuzz", "cat", "json"]
    assert [p.category for p in perf.values()] == ["open", "open", "structured", "structured"]
    assert perf["cat"].text == "Repeat the following line 10 times: the cat sat on the mat."
    assert [p.id for p in get_suite("mini-structured")] == [
        "repeat",
        "count",
        "json-template",
        "code-edit",
    ]
    assert len(get_suite("mini-open-ended")) == 6
    mixed = get_suite("mixed")
    assert len(mixed) == 8 and mixed[0].text == perf["palindrome"].text
    brief = get_suite("brief")
    assert len(brief) == 8 and brief[0].text == "Explain why the sky is blue."


def test_builtin_lines() -> None:
    lines = builtin_lines()
    assert len(lines) > 20 and all(line.strip() for line in lines)


def test_the_registry_imports_no_torch_engine_or_models() -> None:
    code = (
        "import sys, specserve.bench.suites, specserve.bench.workloads\n"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith(("
        "'specserve.engine', 'specserve.server', 'specserve.models', 'specserve.spec_decode'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
