"""The ``endpoints:`` block of an experiment config that points at two local mock servers."""

from __future__ import annotations


def mock_endpoints(base_port: int, spec_port: int, model: str = "mock-model") -> dict:
    """Baseline and speculative arms on 127.0.0.1 at the given ports, both serving ``model``."""
    return {
        arm: {"base_url": f"http://127.0.0.1:{port}", "model": model}
        for arm, port in (("baseline", base_port), ("speculative", spec_port))
    }
