"""The HTML report: self-contained, and its plots really drawn (headless Chromium screenshot)."""

from __future__ import annotations

from support.reports import report  # noqa: F401 (fixtures)


def test_the_report_is_one_self_contained_file(report):
    text = report.read_text()
    assert "<svg" in text and "Loss vs forecast" in text and "Health checklist" in text
    for remote in ("http://", "https://", "<script src", "<link"):
        assert remote not in text  # nothing is fetched: it opens offline, anywhere
