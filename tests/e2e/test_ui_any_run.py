"""The run page of any run, in Debian's chromium: a plain loop's 20 metrics logged through `runledger.init/log`
(a real nats-server and ledger process, served by `runledger ui`) read as W&B's page does: sections by
prefix, a search over metric names, a choice of x and of smoothing, a `define_metric` step metric as its
chart's x, no MoE or forecast panel, and a health checklist of the checks whose inputs the run logged (the
demo run's panels: tests/e2e/test_ui.py).

`RUNLEDGER_UI_SCREENSHOT_DIR=docs pytest tests/e2e/test_ui_any_run.py` also keeps the page's screenshot
there (docs/ui-run.png, shown in docs/dashboard.md).
"""

from __future__ import annotations

import math
import os

import pytest

from support import REPO
from support.browser import chart_points, chromium, wait  # noqa: F401 (chromium: a fixture)
from support.reading import wait_for_count
from support.ui import UiStack

STEPS = 30
LAYERS = 3
# a numpy MLP's 20 names: 6 train/ and val/ each ... (val/* and epoch at each 5th step, define_metric'd against epoch)
TRAIN = ["train/loss", "train/acc", "train/batch_loss_std", "train/logit_mean"]
VAL = ["val/loss", "val/acc", "val/f1", "val/precision", "val/recall"]
LAYER = [f"layers/{i}/{n}" for n in ("grad_norm", "weight_norm") for i in range(LAYERS)]
PLAIN = ["lr", "epoch", "weight_decay"]
PERF = ["perf/step_time", "perf/samples_per_s"]
NAMES = TRAIN + VAL + LAYER + PLAIN + PERF
# the checks whose inputs such a loop never logs: they must not be listed on its page
NOT_LOGGED = ("drop_fraction", "drops_vs_ladder", "forecast_hit", "grad_norm_max", "grad_norm_rise", "lr_schedule",
              "mfu_below_plan", "mfu_constant", "param_norm_growth", "router_entropy", "router_bias", "throughput_floor")


class AnyRunPage(UiStack):
    """A nats-server, a ledger process, two runs (a numpy-like loop through runledger.init, and one that sent
    a metric only), and `runledger ui` over them."""

    def log_runs(self) -> None:
        import runledger
        from runledger.ledger.contract.events import MetricsLogged
        from runledger.ledger.emit.emitter import Emitter

        run = runledger.init(project="mlp", id="mlp", config={"lr": 0.1, "hidden": [64, 64]}, root=self.root,
                             nats=self.nats.url, system_metrics=False)
        runledger.define_metric("val/*", step_metric="epoch")
        for k in range(1, STEPS + 1):
            noise = 0.08 * math.sin(7.3 * k)  # (deterministic)
            row = {"train/loss": 2.0 * math.exp(-k / 10) + noise, "train/acc": 1 - math.exp(-k / 8) - noise / 2,
                   "train/batch_loss_std": 0.1 + noise / 4, "train/logit_mean": 0.01 * k, "lr": 0.1, "weight_decay": 1e-4, "perf/step_time": 0.01,
                   "perf/samples_per_s": 6400.0 + k, **{n: 1.0 + 0.01 * k for n in LAYER}}
            if k % 5 == 0:
                row.update({"epoch": k // 5, "val/loss": 2.1 * math.exp(-k / 11), "val/acc": 0.9, "val/f1": 0.8,
                            "val/precision": 0.85, "val/recall": 0.75})
            runledger.log(row, step=k)
        assert run.finish()
        bare = Emitter("bare", "worker-0", 0, self.nats.url, self.tmp / "spool")  # no run_started, no loss
        bare.emit(MetricsLogged(metrics={"acc": 0.5}), step=1)
        assert bare.close(timeout=30)
        wait_for_count(self.root, "select count(*) from metric_events where run_id in ('mlp', 'bare')", STEPS + 1, timeout=60)



@pytest.fixture(scope="module")
def any_run(tmp_path_factory):
    s = AnyRunPage(tmp_path_factory.mktemp("anyrun"))
    try:
        s.log_runs()
        s.url = s.start_ui().line  # the address (with its token)
        yield s
    finally:
        s.stop()


def open_run(driver, any_run, run: str) -> None:
    base = any_run.url.split("#")[0]
    driver.get(f"{base}#/run/{run}")
    wait(driver, lambda d: d.execute_script(f"return document.body.dataset.ready === '1' && location.hash === '#/run/{run}'"),
         what=f"run page {run}")


def shown_titles(driver) -> list[str]:
    return driver.execute_script("return [...document.querySelectorAll('.chart')].filter(c => c.offsetParent !== null)"
                                 ".map(c => c.dataset.title)")


def xs_of(driver, title: str) -> list:
    return driver.execute_script("const c = window.rlCharts.find(c => c.title === arguments[0]);"
                                 "return c.tables.get('attempt 0')[0];", title)


def test_a_plain_loops_page_has_its_metrics_in_sections_and_no_panel_it_has_no_data_for(any_run, chromium):
    open_run(chromium, any_run, "mlp")
    sections = chromium.execute_script("return [...document.querySelectorAll('details.section')].map(s => "
                                       "[s.dataset.section, s.open, s.querySelector('summary').textContent.trim()])")
    assert sections == [["Charts", True, "Charts 3"], ["layers", True, "layers 6"], ["perf", True, "perf 2"],
                        ["train", True, "train 4"], ["val", True, "val 5"]]
    titles = chromium.execute_script("return window.rlCharts.map(c => c.title)")
    assert sorted(titles) == sorted(NAMES)  # every metric, by its own name; no MoE, forecast or MFU panel
    assert not chromium.find_elements("css selector", ".chart .empty")  # never a "no data in the ledger" box
    assert chart_points(chromium, "train/loss") == STEPS and chart_points(chromium, "val/acc") == STEPS // 5
    # val/* against epoch (define_metric's step_metric); the rest against the step
    assert xs_of(chromium, "val/loss") == [1, 2, 3, 4, 5, 6] and xs_of(chromium, "train/loss") == list(range(1, STEPS + 1))
    keep = os.environ.get("RUNLEDGER_UI_SCREENSHOT_DIR")
    if keep:  # the page's first 2,000 pixels, smoothed as W&B draws by default
        (REPO / keep).mkdir(parents=True, exist_ok=True)
        chromium.set_window_size(1400, 2000)
        chromium.execute_script("const s = document.getElementById('smoothing'); s.value = '0.6'; s.dispatchEvent(new Event('input'))")
        wait(chromium, lambda d: d.execute_script("return window.rlCharts.filter(c => c.plot).length >= 12"), what="drawn in view")
        chromium.save_screenshot(str(REPO / keep / "ui-run.png"))
        chromium.set_window_size(1400, 1000)


def test_the_search_box_hides_the_charts_whose_names_do_not_match(any_run, chromium):
    open_run(chromium, any_run, "mlp")
    box = chromium.find_element("id", "metric-filter")
    for text, expected in (("^val/", VAL), ("grad_NORM", LAYER[:LAYERS]), ("loss", ["train/loss", "train/batch_loss_std", "val/loss"])):
        box.clear()
        box.send_keys(text)
        wait(chromium, lambda d: sorted(shown_titles(d)) == sorted(expected), what=f"the charts matching {text!r}")
    hidden = chromium.execute_script("return [...document.querySelectorAll('details.section')].filter(s => s.hidden).map(s => s.dataset.section)")
    assert hidden == ["Charts", "layers", "perf"]  # (a section with no chart left is hidden too)
    box.clear()
    box.send_keys("x")
    box.send_keys("\b")
    wait(chromium, lambda d: len(shown_titles(d)) == len(NAMES), what="every chart again")


def test_the_x_axis_and_smoothing_change_what_is_drawn_not_the_points(any_run, chromium):
    from selenium.webdriver.support.ui import Select

    open_run(chromium, any_run, "mlp")
    steps = xs_of(chromium, "train/loss")
    Select(chromium.find_element("id", "x-axis")).select_by_value("rel")
    wait(chromium, lambda d: d.execute_script("return window.rlCharts.every(c => c.el.dataset.x === 'rel')"), what="x = relative time")
    rel = xs_of(chromium, "train/loss")
    # seconds since start; a burst of steps logged within one pixel's time is drawn as its lowest and highest point
    assert 2 <= len(rel) <= STEPS and rel != steps and rel == sorted(rel) and 0 <= rel[0] and rel[-1] < 600
    assert 1 <= len(xs_of(chromium, "val/loss")) <= STEPS // 5 and xs_of(chromium, "val/loss") != [1, 2, 3, 4, 5, 6]
    Select(chromium.find_element("id", "x-axis")).select_by_value("step")
    wait(chromium, lambda d: xs_of(d, "train/loss") == steps and xs_of(d, "val/loss") == [1, 2, 3, 4, 5, 6],
         what="x = step again (val/* against epoch)")
    assert chromium.execute_script("return document.querySelector('#x-axis option[value=tokens]').disabled")  # no tokens_per_step
    chromium.execute_script("const s = document.getElementById('smoothing'); s.value = '0.9'; s.dispatchEvent(new Event('input'))")
    chromium.execute_script("window.rlCharts.find(c => c.title === 'train/loss').el.scrollIntoView()")  # (drawn once in view)
    wait(chromium, lambda d: d.execute_script("return !!window.rlCharts.find(c => c.title === 'train/loss').plot"), what="drawn")
    labels = chromium.execute_script("return window.rlCharts.find(c => c.title === 'train/loss').plot.series.map(s => s.label)")
    assert labels[1:] == ["attempt 0", "attempt 0 (smoothed)"]  # drawn on top of the raw line
    smoothed = chromium.execute_script("return window.rlCharts.find(c => c.title === 'train/loss').plot.data[2]")
    raw = chromium.execute_script("return window.rlCharts.find(c => c.title === 'train/loss').plot.data[1]")
    assert smoothed[0] == raw[0] and max(abs(a - b) for a, b in zip(smoothed, raw)) > 0.01  # (debiased: starts on the data)
    assert chart_points(chromium, "train/loss") == STEPS  # the chart's points are still the data


def test_the_health_checklist_lists_only_the_checks_whose_inputs_the_run_logged(any_run, chromium):
    open_run(chromium, any_run, "mlp")
    wait(chromium, lambda d: d.find_elements("css selector", "#health table"), what="health checklist")
    listed = chromium.execute_script("return [...document.querySelectorAll('#health tbody tr')].map(r => r.cells[0].textContent)")
    assert set(listed) == {"config_match", "telemetry_silence", "skipped_steps", "loss_floor", "loss_decreasing",
                           "eval_decreasing",
                           # issue 43's that read a loss, the steps or a run_started
                           "loss_spike", "nonfinite_loss", "still_initializing", "telemetry_gone", "run_down",
                           "resume_matches", "checkpoints_advancing", "attempt_started", "compute_thresholds"}
    left = chromium.find_element("id", "health-left").text
    assert all(check in left for check in NOT_LOGGED)
    open_run(chromium, any_run, "bare")
    line = wait(chromium, lambda d: d.find_elements("id", "health-none"), what="the one-line message")[0].text
    assert line.startswith("No health check applies to this run: it logged none of their inputs")
    assert not chromium.find_elements("css selector", "#health table")


def test_a_chart_drawn_against_time_and_smoothed_takes_live_points(any_run, chromium):
    """A chart not drawn against the step asks for its points again when new ones are stored (no reload)."""
    from selenium.webdriver.support.ui import Select

    from runledger.ledger.contract.events import MetricsLogged, RunStarted
    from runledger.ledger.emit.emitter import Emitter

    worker = Emitter("growing", "worker-0", 0, any_run.nats.url, any_run.tmp / "spool")
    try:
        worker.emit(RunStarted(config={}, config_hash="0" * 64), step=0)
        for k in range(1, 6):
            worker.emit(MetricsLogged(metrics={"train/loss": 1.0 / k}), step=k)
        assert worker.flush(timeout=30)
        wait_for_count(any_run.root, "select count(*) from metric_events where run_id = 'growing'", 5, timeout=60)
        open_run(chromium, any_run, "growing")
        wait(chromium, lambda d: "live" in d.find_element("id", "live").get_attribute("class").split(), what="live feed")
        chromium.execute_script("window.__notReloaded = true; const s = document.getElementById('smoothing');"
                                "s.value = '0.5'; s.dispatchEvent(new Event('input'))")
        Select(chromium.find_element("id", "x-axis")).select_by_value("rel")
        wait(chromium, lambda d: d.execute_script("return window.rlCharts[0].el.dataset.x === 'rel'"), what="x = relative time")
        worker.emit(MetricsLogged(metrics={"train/loss": 0.1}), step=6)
        assert worker.flush(timeout=30)
        # (five points logged within a millisecond share a pixel against time: its lowest and highest are drawn)
        wait(chromium, lambda d: d.execute_script("return window.rlCharts[0].tables.get('attempt 0')[1].slice(-1)[0]") == 0.1,
             timeout=30, what="the new step, asked for again")
        assert chromium.execute_script("return window.__notReloaded === true && window.rlCharts[0].el.dataset.x === 'rel'")
        labels = chromium.execute_script("return window.rlCharts[0].plot.series.map(s => s.label)")
        assert labels[1:] == ["attempt 0", "attempt 0 (smoothed)"]
    finally:
        worker.close(timeout=5)
