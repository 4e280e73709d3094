"""The HTML report: self-contained, and its plots really drawn (headless Chromium screenshot)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile

import pytest

from runledger.tools.report import SERIES
from support.reports import report  # noqa: F401 (fixtures)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def chromium_binary() -> str:
    """Debian's headless chromium (a test that takes it is slow: a browser starts)."""
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (make test installs it when run as root)")
    return CHROMIUM


def test_chromium_draws_every_plot_with_data(report, chromium_binary, tmp_path):
    from PIL import Image

    png = tmp_path / "shot.png"
    subprocess.run([chromium_binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
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
