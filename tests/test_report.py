"""The HTML report: self-contained, and its plots really drawn (headless Chromium screenshot)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from test_agents import make_run
from runledger.tools.report import SERIES, write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def report(tmp_path) -> Path:
    make_run(tmp_path / "root", "r", drop=lambda k: 0.02 + 0.001 * k, grad=lambda k: 1 + 0.01 * k,
             loss=lambda k: 4.0 - 0.01 * k, forecasts=[(0.05, 3.9, 3.7, 4.1), (0.1, 3.7, 3.5, 3.9), (0.15, 3.5, 3.3, 3.7)])
    return write_report(tmp_path / "root", "r", tmp_path / "report.html")


def test_the_report_is_one_self_contained_file(report):
    text = report.read_text()
    assert "<svg" in text and "Loss vs forecast" in text and "Health checklist" in text
    for remote in ("http://", "https://", "<script src", "<link"):
        assert remote not in text  # nothing is fetched: it opens offline, anywhere


@pytest.fixture
def chromium() -> str:
    """Debian's headless chromium (a test that takes it is slow: a browser starts)."""
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (make test installs it when run as root)")
    return CHROMIUM


def test_chromium_draws_every_plot_with_data(report, chromium, tmp_path):
    from PIL import Image

    png = tmp_path / "shot.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tempfile.mkdtemp()}", "--window-size=1200,1600", f"--screenshot={png}",
                    report.as_uri()], capture_output=True, timeout=120, check=True)
    img = Image.open(png).convert("RGB")
    counts = {}
    for rgb in img.getdata():
        counts[rgb] = counts.get(rgb, 0) + 1
    for name, color in SERIES.items():
        if name == "mfu":
            continue  # the synthetic run records no MFU: its plot says "no data" instead
        rgb = tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))
        assert counts.get(rgb, 0) > 50, f"the {name} plot has no pixels of its color {color}: not drawn"
    assert counts.get((255, 255, 255), 0) < img.width * img.height * 0.97  # not a blank page
