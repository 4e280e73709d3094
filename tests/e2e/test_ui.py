"""The dashboard (`runledger ui`): its access rules and its downsampling on a ledger written by the real
writer, then the whole thing in Debian's chromium: a real nats-server, a real ledger process, the UI
served by `runledger ui` on a non-loopback address with a token, and an Emitter logging while the page
is open. One browser and one server for the module.

`RUNLEDGER_UI_SCREENSHOT=docs/ui.png pytest tests/{unit,integration,e2e}/test_ui.py -k charts` also keeps the run page's
screenshot there (the README's first screen).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from support import REPO
from support.browser import chart_points, chromium, wait  # noqa: F401 (chromium: a fixture)
from support.reading import wait_for_count
from support.ui import UiStack

TOKEN, READ_TOKEN = "write-token-0123456789abcdef", "read-token-0123456789abcdef"
LOSS_RGB = (0xD6, 0x27, 0x28)  # the first series' color (app.js COLORS[0]): attempt 0's loss line
WATCHDOG_S = 30.0  # a hang guard, not a promise of speed


class Served(UiStack):
    """A nats-server, a ledger process, a worker's and an agent's Emitters, and `runledger ui`."""

    def __init__(self, tmp: Path):
        from runledger.ledger.emit.emitter import Emitter

        super().__init__(tmp)
        self.worker = Emitter("alpha", "worker-0", 0, self.nats.url, tmp / "spool")
        self.agent = Emitter("alpha", "agent-drops", 0, self.nats.url, tmp / "spool")
        self.step = 0

    def write_runs(self) -> None:
        from runledger.ledger.contract.events import DecisionMade, ForecastMade, MetricsLogged, ResumedFrom, RunStarted
        from runledger.ledger.emit.emitter import Emitter

        start = dict(config={"model": {"layers": 4}, "lr": 3e-4}, config_hash="0" * 64, tags=["demo", "ui"],
                     project="tests", token_budget=100 * 1000, tokens_per_step=1000)
        first = self.worker  # attempt 0 trains to step 40; attempt 1 resumes from its checkpoint at 30
        first.emit(RunStarted(**start), step=0)
        for k in range(1, 41):
            self.log_step(k, first)
        assert first.close(timeout=30)
        self.worker = Emitter("alpha", "worker-0", 1, self.nats.url, self.tmp / "spool")
        self.worker.emit(RunStarted(**start, resumed_from=ResumedFrom(path="ckpt/30", step=30, content_hash="h")), step=30)
        for k in range(31, 46):
            self.log_step(k)
        for frac, proj in ((0.2, 3.4), (0.4, 3.2), (0.6, 3.0)):
            self.worker.emit(ForecastMade(target_run="alpha", fraction=frac, target_tokens=int(frac * 100_000),
                                          projected_loss=proj, band_low=proj - 0.2, band_high=proj + 0.2), step=None)
        self.agent.emit(DecisionMade(decision_id="agent-drops:cf:1", agent="agent-drops", rule="drop_fraction_high",
                                     action="set_capacity_factor", params={"cf_recv": 1.5}, mode="proposed",
                                     rationale="drops above 7% for 3 blocks", evidence={"rows": [{"drop_fraction": 0.09}]}),
                        step=40)
        beta = Emitter("beta", "worker-0", 0, self.nats.url, self.tmp / "spool")
        beta.emit(RunStarted(config={"model": {"layers": 8}, "lr": 3e-4}, config_hash="1" * 64, tags=["ui"]), step=0)
        beta.emit(MetricsLogged(metrics={"train/loss": 4.0, "acc": 0.1}), step=1)
        assert beta.close(timeout=30) and self.worker.flush(timeout=30) and self.agent.flush(timeout=30)
        wait_for_count(self.root, "select count(*) from decisions", 1, timeout=60)
        wait_for_count(self.root, "select count(*) from steps_all where run_id = 'alpha'", 55, timeout=60)

    def log_step(self, k: int, worker=None) -> None:
        """Step k of alpha: a typed step, its drops (two MoE layers) and a free-form metric."""
        from runledger.ledger.contract.events import LayerDrops, MetricsLogged, StepCompleted, TokensDropped

        worker = worker or self.worker
        worker.emit(StepCompleted(loss=4.0 - 0.02 * k + 0.05 * (k > 30), grad_norm=1.0 + 0.01 * k, lr=3e-4 * min(1, k / 10),
                                  tokens=1000, step_time_s=0.5, mfu=0.4 + 0.002 * (k % 7)), step=k)
        frac = [0.02 + 0.001 * k, 0.05 - 0.0005 * k]
        worker.emit(TokensDropped(dispatch="capacity", assignments=2000, dropped=int(1000 * sum(frac)), drop_fraction=sum(frac) / 2,
                                  layers=[LayerDrops(layer=i, assignments=1000, sender_dropped=0, receiver_dropped=int(1000 * f),
                                                     drop_fraction=f) for i, f in enumerate(frac)]), step=k)
        worker.emit(MetricsLogged(metrics={"eval/acc": 0.1 + 0.01 * k}), step=k)
        self.step = k

    def stop(self) -> None:
        for em in (self.worker, self.agent):
            em.close(timeout=5)
        super().stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = Served(tmp_path_factory.mktemp("ui"))
    try:
        s.write_runs()
        s.base = s.start_ui("--host", "0.0.0.0", "--token", TOKEN, "--read-token", READ_TOKEN).base
        yield s
    finally:
        s.stop()


@pytest.mark.slow  # (the served fixture starts nats-server, a ledger and the UI: processes)
def test_without_the_token_the_served_ui_refuses_every_request(served):
    for path in ("/api/runs", "/api/status", "/api/live", "/api/run/alpha", "/api/sql?q=select%201"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(served.base + path, timeout=10)
        assert err.value.code == 401, path


def test_the_runs_page_lists_the_runs(served, chromium):
    chromium.get(f"{served.base}/?token={TOKEN}")
    wait(chromium, lambda d: len(d.find_elements("css selector", "a.run-link")) >= 2, what="run links")
    links = {a.text for a in chromium.find_elements("css selector", "a.run-link")}
    assert links == {"alpha", "beta"}
    assert "demo" in chromium.find_element("css selector", "#runs").text  # tags shown


def test_clicking_a_run_draws_its_charts_with_data(served, chromium, tmp_path):
    from PIL import Image

    chromium.get(f"{served.base}/?token={TOKEN}#/")
    wait(chromium, lambda d: d.find_elements("css selector", "a.run-link"), what="runs")
    next(a for a in chromium.find_elements("css selector", "a.run-link") if a.text == "alpha").click()
    wait(chromium, lambda d: d.execute_script("return document.body.dataset.ready === '1' && location.hash === '#/run/alpha'"))
    assert chart_points(chromium, "Loss vs forecast band") == 55  # 40 steps of attempt 0, 15 of attempt 1
    assert chart_points(chromium, "MFU") == 55
    assert chart_points(chromium, "eval/acc") == 55
    assert chart_points(chromium, "Token drop fraction per layer") == 2 * 55  # two layers
    series = chromium.execute_script("return window.rlCharts.find(c => c.title === 'Loss vs forecast band').plot.series.map(s => s.label)")
    assert series[1:3] == ["attempt 0", "attempt 1"]  # attempts shown as attempts
    wait(chromium, lambda d: "config_match" in d.find_element("css selector", "#health").text, what="health checklist")
    assert "set_capacity_factor" in chromium.find_element("css selector", "#decisions").text
    canvas = next(c for c in chromium.find_elements("css selector", ".chart")
                  if c.get_attribute("data-title") == "Loss vs forecast band").find_element("css selector", "canvas")
    png = tmp_path / "loss.png"
    canvas.screenshot(str(png))
    pixels = np.asarray(Image.open(png).convert("RGB")).reshape(-1, 3).astype(int)
    near = int((np.abs(pixels - LOSS_RGB).max(axis=1) < 40).sum())  # (anti-aliased: near the color)
    assert near > 50, "the loss line is not drawn: the canvas has no pixels of its color"
    assert len(np.unique(pixels, axis=0)) > 10  # not blank
    keep = os.environ.get("RUNLEDGER_UI_SCREENSHOT")
    if keep:
        (REPO / keep).parent.mkdir(parents=True, exist_ok=True)
        chromium.save_screenshot(str(REPO / keep))
    # zoomed in (as a drag does), the chart holds the exact points of the range, fetched again
    chromium.execute_script("window.rlCharts.find(c => c.title === 'Loss vs forecast band').plot.setScale('x', {min: 10, max: 20})")
    wait(chromium, lambda d: d.execute_script(
        "return window.rlCharts.find(c => c.title === 'Loss vs forecast band').el.dataset.zoom === '10,20'"), what="zoom")
    assert chart_points(chromium, "Loss vs forecast band") == 11  # steps 10..20 of attempt 0


def test_the_demo_runs_page_keeps_its_moe_and_forecast_panels(served, chromium):
    """The panels of the trainer's data are drawn where the run has that data (the generic run's page, which
    has none of them: tests/e2e/test_ui_any_run.py)."""
    from selenium.webdriver.support.ui import Select

    chromium.get(f"{served.base}/?token={TOKEN}#/run/alpha")
    wait(chromium, lambda d: d.execute_script("return document.body.dataset.ready === '1' && location.hash === '#/run/alpha'"))
    sections = chromium.execute_script("return [...document.querySelectorAll('details.section')].map(s => s.dataset.section)")
    assert sections[0] == "Charts" and "MoE" in sections and "eval" in sections  # the run's own metrics first
    moe = chromium.execute_script("return [...document.querySelectorAll('details.section[data-section=MoE] .chart')].map(c => c.dataset.title)")
    assert moe == ["Token drop fraction per layer"] and chart_points(chromium, "Token drop fraction per layer") == 2 * 55
    panels = chromium.execute_script("""const c = t => window.rlCharts.find(c => c.title === t);
        return [c('Loss vs forecast band').band[0].length, c('Learning rate, decisions marked').markers.length]""")
    assert panels == [3, 1]  # the three forecast points; the proposed decision marked
    assert chart_points(chromium, "MFU") == 55 and not chromium.find_elements("css selector", ".chart .empty")
    # no capacity panel: the run's one capacity decision is proposed, not applied; an applied one's factors are drawn
    cf = chromium.execute_script("""return capacityFactors([
        {action: 'set_capacity_factor', status: 'applied', decided_at_step: 8, applied_at_step: 10, params: {cf_recv: 1.5},
         before: {dispatch: 'capacity', cf_send: 1.25, cf_recv: 1.25}, after: {dispatch: 'capacity', cf_send: 1.25, cf_recv: 1.5}},
        {action: 'set_capacity_factor', status: 'refused', decided_at_step: 20, applied_at_step: 21, params: {cf: 3}}])""")
    assert cf == {"cf_send": [[8, 10], [1.25, 1.25]], "cf_recv": [[8, 10], [1.25, 1.5]]}
    # against tokens (the run's tokens_per_step, 1000): the points, the band and the marks move together
    Select(chromium.find_element("id", "x-axis")).select_by_value("tokens")
    wait(chromium, lambda d: d.execute_script("return window.rlCharts.every(c => c.el.dataset.x === 'tokens')"), what="x = tokens")
    got = chromium.execute_script("""const c = t => window.rlCharts.find(c => c.title === t);
        return [c('Loss vs forecast band').tables.get('attempt 0')[0].slice(0, 2), c('Loss vs forecast band').band[0],
                c('Learning rate, decisions marked').markers.map(m => m[0]), c('Token drop fraction per layer').points()]""")
    assert got == [[1000, 2000], [20_000, 40_000, 60_000], [40_000], 2 * 55]
    Select(chromium.find_element("id", "x-axis")).select_by_value("time")  # (no band: it is at steps)
    wait(chromium, lambda d: d.execute_script("return window.rlCharts.every(c => c.el.dataset.x === 'time')"), what="x = time")
    got = chromium.execute_script("""const c = t => window.rlCharts.find(c => c.title === t);
        return [c('Loss vs forecast band').band, Math.min(...c('Token drop fraction per layer').tables.get('layer 0 · attempt 0')[0])]""")
    assert got[0] is None and got[1] > 1e9  # seconds since the epoch (points a pixel apart in time drawn as its lowest and highest)


def test_a_step_logged_while_the_page_is_open_appears_without_a_reload(served, chromium):
    chromium.get(f"{served.base}/?token={TOKEN}#/run/alpha")
    wait(chromium, lambda d: chart_points(d, "Loss vs forecast band") >= 55)
    wait(chromium, lambda d: "live" in d.find_element("id", "live").get_attribute("class").split(), what="live feed")
    chromium.execute_script("window.__notReloaded = true")
    before = chart_points(chromium, "Loss vs forecast band")
    served.log_step(served.step + 1)
    wait(chromium, lambda d: chart_points(d, "Loss vs forecast band") == before + 1
         and chart_points(d, "eval/acc") == before + 1, timeout=WATCHDOG_S,
         what="the new step (typed and free-form) on the page")  # how soon: bench/ui.py, not a test
    assert chromium.execute_script("return window.__notReloaded === true")


def test_approving_a_proposed_decision_stores_a_decision_event_with_the_approver(served, chromium):
    from selenium.common.exceptions import StaleElementReferenceException

    from runledger import queries

    chromium.get(f"{served.base}/?token={TOKEN}#/run/alpha")
    for _ in range(3):  # (the trail is drawn again if a decision arrives meanwhile)
        try:
            box = wait(chromium, lambda d: d.find_elements("css selector", ".decide"), what="the proposed decision")[0]
            who = box.find_element("css selector", "input.who")
            who.clear()
            who.send_keys("Ada Lovelace")
            box.find_element("css selector", "button.approve").click()
            break
        except StaleElementReferenceException:
            continue
    wait(chromium, lambda d: "recorded" in d.find_element("css selector", ".decide .msg").text, timeout=40)
    wait_for_count(served.root, "select count(*) from decisions where action = 'approve'", 1, timeout=30)
    rows = queries.query(served.root, "select agent, params ->> 'decision_id', producer from decisions where action = 'approve'")[1]
    assert rows == [("person:Ada Lovelace", "agent-drops:cf:1", "ui")]
    # and the page shows who decided, live
    wait(chromium, lambda d: "by person:Ada Lovelace" in d.find_element("css selector", "#decisions").text, timeout=10)


def test_acknowledging_an_alert_stores_an_alert_ack_with_who_took_it(served, chromium):
    from runledger import queries
    from runledger.ledger.contract.events import AlertRaised

    served.agent.emit(AlertRaised(alert_id="agent-drops:alpha:drop_fraction:9", agent="agent-drops", rule="drop_fraction",
                                  severity="fail", message="drops above 7% for 3 blocks"), step=45)
    assert served.agent.flush(timeout=30)
    wait_for_count(served.root, "select count(*) from alerts where alert_id like '%:9'", 1, timeout=60)
    chromium.get(f"{served.base}/?token={TOKEN}#/run/alpha")
    box = wait(chromium, lambda d: d.find_elements("css selector", "#alerts .ack"), what="the open alert")[0]
    who = box.find_element("css selector", "input.who")
    who.clear()
    who.send_keys("Grace Hopper")
    box.find_element("css selector", "button.acknowledge").click()
    wait(chromium, lambda d: "recorded" in d.find_element("css selector", "#alerts .msg").text, timeout=40)
    wait_for_count(served.root, "select count(*) from alert_acks", 1, timeout=30)
    rows = queries.query(served.root, 'select alert_id, "by", via, producer from alert_acks')[1]
    assert rows == [("agent-drops:alpha:drop_fraction:9", "Grace Hopper", "dashboard", "ui")]
