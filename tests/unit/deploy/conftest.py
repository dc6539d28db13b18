"""Deploy-test fixtures: the demo config rendered once, and its kustomize builds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specserve.deploy.render import render
from tests.unit.deploy.deploy_helpers import kustomize_build, make_config


@pytest.fixture(scope="session")
def demo_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo config (every platform enabled) rendered once."""
    out = tmp_path_factory.mktemp("demo")
    render(make_config(), out)
    return out


@pytest.fixture(scope="session")
def demo_builds(demo_tree: Path) -> dict[str, list[dict[str, Any]]]:
    """``overlay -> kustomize build output`` of the demo tree."""
    return {o: kustomize_build(demo_tree / "overlays" / o) for o in make_config().overlays}
