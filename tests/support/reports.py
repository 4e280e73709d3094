"""reports: shared by the tests (tests/support: every helper defined once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runledger.tools.report import write_report
from support.runs import make_run


@pytest.fixture
def report(tmp_path) -> Path:
    make_run(tmp_path / "root", "r", drop=lambda k: 0.02 + 0.001 * k, grad=lambda k: 1 + 0.01 * k,
             loss=lambda k: 4.0 - 0.01 * k, forecasts=[(0.05, 3.9, 3.7, 4.1), (0.1, 3.7, 3.5, 3.9), (0.15, 3.5, 3.3, 3.7)])
    return write_report(tmp_path / "root", "r", tmp_path / "report.html")
