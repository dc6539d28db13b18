"""The HTML reports render in headless Chromium: plots drawn, no console messages, and the
experiment's report.html answers "turn speculative decoding on?" in its first screen.

Skipped when no ``chromium`` binary is installed (scripts/setup.sh installs it when it can).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html import unescape as html_unescape
from pathlib import Path

import numpy as np
import pytest

from specserve.bench.compare import compare
from specserve.bench.inputs import BenchConfig, ClosedLoop, WorkloadConfig
from specserve.bench.mock_server import MockConfig, serve_in_thread
from specserve.bench.runner import run_ab
from specserve.experiment.config import ExperimentConfig
from specserve.experiment.runner import run_experiment
from specserve.report.html import write_report
from tests.mock_endpoints import mock_endpoints

PIL = pytest.importorskip("PIL.Image")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed"),
]
BLUE = (0x1F, 0x77, 0xB4)  # first palette colour: baseline lines and bars
ON_GREEN = (0x1A, 0x7F, 0x37)  # background of a "Turn it ON" verdict


def headless(*flags: str) -> list[str]:
    """The Chromium command line for one headless render with ``flags``."""
    assert CHROMIUM is not None
    return [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *flags]


def screenshot(html: Path, png: Path, height: int) -> list[str]:
    """Render ``html``; returns Chromium's console-message log lines."""
    assert CHROMIUM is not None
    proc = subprocess.run(
        headless(
            "--enable-logging=stderr",
            "--v=0",
            f"--window-size=1300,{height}",
            f"--screenshot={png}",
            html.resolve().as_uri(),
        ),
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


PROBE = """<script>
const box = (el) => el.getBoundingClientRect();
const cards = [...document.querySelectorAll('.card')].map((c) => [
  c.id, box(c.querySelector('.decision')).top, box(c.querySelector('.quality')).bottom,
].join(':'));
document.body.setAttribute('data-probe', JSON.stringify({
  cards, width: window.innerWidth, curve: box(document.getElementById('curve')).top,
}));
</script></body>"""


def layout(html: Path, height: int) -> dict:
    """Positions (px from the top of the page) of the verdict cards laid out 1300 px wide,
    measured by Chromium in a copy of the page with a probe script, dumped with --dump-dom.
    (There the viewport is shorter than the window; positions do not depend on its height.)"""
    assert CHROMIUM is not None
    probe = html.with_name("probe.html")
    probe.write_text(html.read_text(encoding="utf-8").replace("</body>", PROBE), encoding="utf-8")
    proc = subprocess.run(
        headless(
            f"--window-size=1300,{height}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            probe.resolve().as_uri(),
        ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    found = re.search(r'data-probe="([^"]*)"', proc.stdout)
    assert found, proc.stderr[-2000:]
    return json.loads(html_unescape(found.group(1)))


def test_experiment_report_answers_in_the_first_screen(tmp_path: Path) -> None:
    base_cfg = MockConfig(ttft_ms=5, itl_ms=6, tokens_per_chunk=1, output_tokens=12)
    spec_cfg = MockConfig(ttft_ms=5, itl_ms=2, tokens_per_chunk=3, output_tokens=12, spec_k=3)
    with serve_in_thread(base_cfg) as base, serve_in_thread(spec_cfg) as spec:
        cfg = ExperimentConfig.model_validate(
            {
                "output_dir": str(tmp_path / "out"),
                "endpoints": mock_endpoints(base.port, spec.port, model="m"),
                "benchmark": {
                    "concurrency": [1, 2],
                    "rates": [30],
                    "num_requests": 6,
                    "warmup_requests": 1,
                    "batch_size": 3,
                    "max_tokens": 12,
                },
                "cost": {"instance": "trn1.32xlarge"},
            }
        )
        outcome = run_experiment(cfg, on_status=lambda _: None)
    html = outcome.output_dir / "report.html"
    assert "<script" not in html.read_text(encoding="utf-8")  # self-contained, no code
    png = tmp_path / "first-screen.png"
    assert screenshot(html, png, height=900) == []  # no console messages
    probe = layout(html, height=900)
    assert probe["width"] >= 1280  # laid out as wide as the screenshot
    cards = [c.split(":") for c in probe["cards"]]
    assert [c[0] for c in cards] == ["verdict-structured", "verdict-open-ended"]
    for _, decision_top, quality_bottom in cards:
        # the verdict, its per-load table and the quality line are all in the first 900 px
        assert 0 <= float(decision_top) < float(quality_bottom) <= 900
    assert probe["curve"] > max(float(c[2]) for c in cards)  # then the curve
    img = pixels(png)
    assert img.shape[:2] == (900, 1300)
    green = (np.abs(img - np.array(ON_GREEN)).sum(axis=2) < 30).sum()
    assert green > 2000  # both "Turn it ON" badges are drawn on the first screen
