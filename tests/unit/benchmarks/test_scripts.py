"""Every ``benchmarks/*.py`` script imports cleanly and answers ``--help``, and imports the
package, never a sibling script (the folder is not a package; a sibling import only works
when the script's own folder happens to be on ``sys.path``)."""

from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))


def test_there_are_benchmark_scripts() -> None:
    assert SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_imports_no_sibling(script: Path) -> None:
    siblings = {p.stem for p in SCRIPTS}
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if not node.level else ["(relative import)"]
        else:
            continue
        for name in names:
            root = name.split(".")[0]
            assert root not in siblings and name != "(relative import)", (
                f"{script.name} imports {name}: import from the specserve package instead"
            )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_answers_help(
    script: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(script), run_name="__main__")
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out
