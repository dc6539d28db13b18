"""Container command lines in the manifests parse with specserve's own CLI parser.

These use the real ``specserve.cli.build_parser()``: a container whose subcommand does not
exist yet (``serve``, ``bench`` are built separately) fails here until that command lands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specserve.cli import build_parser
from specserve.commands.bench import build_bench_configs
from specserve.commands.serve import engine_config_from_args
from specserve.deploy.config import load_deploy_config
from specserve.deploy.render import render
from tests.unit.deploy.deploy_helpers import (
    REFERENCE_CONFIGS,
    REPO,
    all_containers,
    kustomize_build,
)


def parse(argv: list[str]) -> Any:
    """Parse like ``specserve ARGV``; a parse error becomes a test failure with the argv."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"specserve {' '.join(argv)!r} does not parse (exit {e.code})")


def specserve_command_lines(objs: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """``(container, argv after 'specserve')`` of every container that runs specserve."""
    lines = []
    for obj in objs:
        if obj["kind"] not in ("Deployment", "Job"):
            continue
        for c in all_containers(obj):
            if c.get("command") == ["specserve"]:
                lines.append((f"{obj['metadata']['name']}/{c['name']}", list(c["args"])))
    return lines


def _by_subcommand(demo_builds: dict[str, list[dict[str, Any]]]) -> dict[str, list[list[str]]]:
    out: dict[str, list[list[str]]] = {}
    for objs in demo_builds.values():
        for _, argv in specserve_command_lines(objs):
            key = argv[0] if argv[0] != "deploy" else f"deploy {argv[1]}"
            out.setdefault(key, []).append(argv)
    return out


def test_demo_has_every_kind_of_command_line(demo_builds: dict[str, list[dict[str, Any]]]) -> None:
    assert set(_by_subcommand(demo_builds)) == {"serve", "bench", "deploy wait", "deploy emf"}


def test_deploy_steps_parse(demo_builds: dict[str, list[dict[str, Any]]]) -> None:
    by = _by_subcommand(demo_builds)
    for argv in by["deploy wait"] + by["deploy emf"]:
        args = parse(argv)
        assert args.command == "deploy"


def test_serve_command_lines_parse(demo_builds: dict[str, list[dict[str, Any]]]) -> None:
    for argv in _by_subcommand(demo_builds)["serve"]:
        assert parse(argv).command == "serve"


def test_bench_command_lines_parse(demo_builds: dict[str, list[dict[str, Any]]]) -> None:
    for argv in _by_subcommand(demo_builds)["bench"]:
        args = parse(argv)
        assert args.command == "bench"
        # Parsed values, not just syntax: both arms, both suites (one comma list), the model.
        assert (args.baseline, args.candidate) == (
            "http://demo-baseline:8000",
            "http://demo-speculative:8000",
        )
        assert args.output == "/results/$(JOB_NAME)"
        # What the bench builds from them: one load point, two arms, both suites.
        (arms,) = build_bench_configs(args)
        assert [a.base_url for a in arms] == [args.baseline, args.candidate]
        for arm in arms:
            assert arm.model == "Qwen/Qwen3-8B"
            assert arm.workload.suites == ("structured", "open-ended")
            assert arm.endpoint == "chat"
            assert arm.num_requests == 100 and arm.sampling.max_tokens == 256
            assert arm.warmup_requests == 2 and arm.sampling.temperature == 0.0


def test_serve_arms_parse_to_the_intended_speculation(
    demo_builds: dict[str, list[dict[str, Any]]],
) -> None:
    for variant in ("cpu", "cuda"):
        lines = dict(specserve_command_lines(demo_builds[f"specserve-{variant}"]))
        base = parse(lines["demo-baseline/server"])
        spec = parse(lines["demo-speculative/server"])
        assert base.spec_method == "none" and base.draft_model is None
        assert spec.draft_model == "/models/Qwen/Qwen3-0.6B"
        assert str(spec.num_speculative_tokens) == "5"
        for args in (base, spec):
            assert args.served_model_name == "Qwen/Qwen3-8B"
            assert (args.max_model_len, args.max_num_seqs, args.port) == (2048, 8, 8000)
            assert args.device == variant
            # What the server builds from them (validated engine config).
            engine = engine_config_from_args(args)
            assert engine.model.device == variant and engine.model.max_model_len == 2048
        assert not engine_config_from_args(base).spec.enabled
        spec_engine = engine_config_from_args(spec).spec
        assert spec_engine.method == "draft" and spec_engine.num_speculative_tokens == 5


@pytest.mark.parametrize("path", REFERENCE_CONFIGS, ids=lambda p: p.stem)
def test_reference_command_lines_parse(path: Path, tmp_path: Path) -> None:
    cfg = load_deploy_config(path)
    render(cfg, tmp_path)
    for overlay in cfg.overlays:
        for _, argv in specserve_command_lines(kustomize_build(tmp_path / "overlays" / overlay)):
            parse(argv)


def test_dockerfile_default_command_parses() -> None:
    lines = (REPO / "Dockerfile").read_text().splitlines()
    cmd = json.loads(next(x for x in reversed(lines) if x.startswith("CMD ")).removeprefix("CMD "))
    assert parse(cmd).command == "serve"
