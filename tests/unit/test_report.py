"""The HTML report: self-contained, and its plots really drawn (headless Chromium screenshot)."""

from __future__ import annotations

import re

from support.reports import report  # noqa: F401 (fixtures)
import pytest

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)


def test_the_report_is_one_self_contained_file(report):
    text = report.read_text()
    assert "<svg" in text and "Loss vs forecast" in text and "Health checklist" in text
    for remote in ("http://", "https://", "<script src", "<link"):
        assert remote not in text  # nothing is fetched: it opens offline, anywhere


def test_the_report_draws_every_metric_the_run_logged_grouped_by_prefix(tmp_path):
    from runledger.ledger.storage import store
    from runledger.tools.report import write_report
    from support.runs import Producer, canonical

    names = ["train/loss", "train/grad_norm", "eval/loss", "eval/acc", "throughput/tokens_per_s", "epoch"]
    run, other = Producer("r"), Producer("other")
    store.write_events(tmp_path / "root", [
        *(canonical(run.event("metrics", {"metrics": {n: float(s + i) for i, n in enumerate(names)}}, s, 1 + 2 * s))
          for s in range(20)),
        canonical(other.event("metrics", {"metrics": {"other/only": 1.0}}, 0, 100))])
    text = write_report(tmp_path / "root", "r", tmp_path / "report.html").read_text()
    section = text.split("<h2>Metrics logged</h2>")[1].split("<h2>")[0]
    drawn = re.findall(r"<div class=\"chart\"><h3>([^<]+)</h3><svg", section)
    assert sorted(drawn) == sorted(names)  # each metric it logged, a chart each, and no other run's
    groups = re.findall(r"<h3>([^<]+)</h3><div class='grid-2'>", section)
    assert groups == ["(no prefix)", "eval/", "throughput/", "train/"]
    assert section.count("<polyline") == len(names)  # each drawn as a line, not an empty chart
