"""The HTML report renders in headless Chromium: plots drawn, no console messages.

Skipped when no ``chromium`` binary is installed (scripts/setup.sh installs it when it can).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from specserve.bench.compare import compare
from specserve.bench.inputs import BenchConfig, ClosedLoop, WorkloadConfig
from specserve.bench.mock_server import MockConfig, serve_in_thread
from specserve.bench.runner import run_ab
from specserve.report.html import write_report

PIL = pytest.importorskip("PIL.Image")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed"),
]
BLUE = (0x1F, 0x77, 0xB4)  # first palette colour: baseline lines and bars


def screenshot(html: Path, png: Path, height: int) -> list[str]:
    """Render ``html``; returns Chromium's console-message log lines."""
    assert CHROMIUM is not None
    proc = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
            f"--window-size=1300,{height}",
            f"--screenshot={png}",
            html.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert png.is_file(), proc.stderr[-2000:]
    return [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


def pixels(png: Path) -> np.ndarray:
    return np.asarray(PIL.open(png).convert("RGB"), dtype=np.int16)  # [H, W, 3]


def test_report_renders_all_plots(tmp_path: Path) -> None:
    results = []
    with (
        serve_in_thread(MockConfig(ttft_ms=5, itl_ms=3, output_tokens=12)) as a,
        serve_in_thread(
            MockConfig(ttft_ms=5, itl_ms=1, output_tokens=12, tokens_per_chunk=3, spec_k=3)
        ) as b,
    ):
        for c in (1, 2):
            specs = [
                BenchConfig(
                    base_url=f"http://127.0.0.1:{s.port}",
                    model="m",
                    label=label,
                    num_requests=6,
                    load=ClosedLoop(concurrency=c),
                    workload=WorkloadConfig(suites=("structured",), categories=("repeat", "json")),
                )
                for label, s in (("baseline", a), ("candidate", b))
            ]
            results += run_ab(specs, batch_size=3)
    paths = write_report(results, compare(results), tmp_path)
    png = tmp_path / "report.png"
    console = screenshot(paths["html"], png, height=6000)
    assert console == []
    img = pixels(png)
    assert img.std() > 20  # not blank
    non_white = (img.sum(axis=2) < 3 * 245).mean()
    assert non_white > 0.03
    blue = (np.abs(img - np.array(BLUE)).sum(axis=2) < 30).sum()
    assert blue > 5000  # bars and lines of the plots were drawn
    # plots reach the end of the page content (ECDFs are last)
    content_rows = np.where((img.sum(axis=2) < 3 * 245).any(axis=1))[0]
    lower = img[content_rows.max() * 2 // 3 : content_rows.max()]
    assert (np.abs(lower - np.array(BLUE)).sum(axis=2) < 30).sum() > 500


def test_console_errors_and_blank_pages_are_detected(tmp_path: Path) -> None:
    """The checks above can fail: a page with a script error, and a blank page."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    console = screenshot(bad, tmp_path / "bad.png", height=300)
    assert any("undefinedFunction" in line for line in console)
    assert pixels(tmp_path / "bad.png").std() < 1
