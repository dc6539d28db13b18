"""``specserve models list`` / ``pull`` argument handling (no network)."""

from __future__ import annotations

import pytest

from specserve.cli import main


def test_list_shows_every_catalog_model_uncached(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["NAME", "ROLE", "SIZE", "CACHED", "FILE"]
    rows = {line.split()[0]: line.split() for line in out[1:]}
    assert rows["qwen2.5-coder-1.5b-instruct"][1] == "target"
    assert rows["qwen2.5-coder-0.5b-instruct"][1] == "draft"
    assert all(r[4] == "no" for r in rows.values())  # private, empty cache dir


def test_pull_rejects_unknown_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["models", "pull", "gpt-5"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
