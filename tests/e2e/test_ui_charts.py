"""The dashboard's charts in Debian's chromium, measured in the page: every tick label of an axis distinct and
inside the canvas, log axes where values span decades, decision labels that meet no other label, the report's
mixture chart with no label over a bar; one page load asks for each chart's points once, and a double-click
(or the "reset zoom" button) after a zoom shows the full range again; the favicon is served.

The ledger is written by the real writer (runledger.ledger.emit.sink, tests/support/audit_ledger.py's Ledger),
served by `runledger ui` with a real nats-server for its live feed. One browser and one server for the module.
"""

from __future__ import annotations

import os
import time
import urllib.request
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

import pytest

from support.audit_ledger import T0, Ledger
from support.browser import chart_points, chromium, wait  # noqa: F401 (chromium: a fixture)
from support.ui import UiProcess

TOKEN = "charts-token-0123456789abcdef"
STEPS = 60
SETTLE_S = 1.0  # what a page may still ask for after it is drawn (a zoom handler's late request) is counted after this
DECISIONS = [(30, "checkpoint_now"), (31, "set_capacity_factor"), (32, "checkpoint_now"), (33, "set_capacity_factor"),
             (34, "checkpoint_now"), (58, "checkpoint_now")]  # five close together, one at the right edge
RUNGS = [(0, 1e9), (1, 1e10), (2, 1e11), (3, 1e12)]  # (rung, flops per token): FLOPs four decades apart


def write_chart_runs(root) -> None:
    led = Ledger(root)
    start = {"config": {"lr": 1e-3}, "config_hash": "0" * 64, "tags": ["charts"], "project": "tests"}
    led.emit("sys", "run_started", start, 0, T0)
    for k in range(1, STEPS + 1):
        at = T0 + timedelta(seconds=k)
        led.emit("sys", "step", {"loss": 4.0 - 0.02 * k, "grad_norm": 1.0, "lr": 1e-3 * min(1.0, k / 10), "tokens": 1000,
                                 "step_time_s": 1.0}, k, at)
        # a machine's temperature: ticks 41.20, 41.21, ... that a 3-digit label reads as one value
        led.emit("sys", "system", {"metrics": {"gpu/0/temp": 41.2 + 0.01 * (k % 5), "proc/rss_bytes": 7.25e9 + 1e4 * k}},
                 None, at)
    for i, (k, action) in enumerate(DECISIONS):
        led.emit("sys", "decision", {"decision_id": f"d{i}", "agent": "agent-x", "rule": "r", "action": action,
                                     "params": {"cf_recv": 1.5} if action == "set_capacity_factor" else {},
                                     "rationale": "close together", "mode": "auto"}, k, T0 + timedelta(seconds=k),
                 producer="agent-x")
    for rung, fpt in RUNGS:  # a ladder: each rung 20 steps of 1000 tokens, final loss falling with its FLOPs
        run = f"rung-{rung}"
        led.emit(run, "run_started", {**start, "flops_per_token": fpt, "ladder": {"name": "lad", "rung": rung, "target": "tgt"}}, 0, T0)
        for k in range(1, 21):
            led.emit(run, "step", {"loss": 2.0 + 100 * (2e4 * fpt) ** -0.1, "grad_norm": 1.0, "lr": 1e-3, "tokens": 1000,
                                   "step_time_s": 1.0}, k, T0 + timedelta(seconds=k))
    led.emit("tgt", "run_started", {**start, "ladder": {"name": "lad", "target": "tgt"}}, 0, T0)
    for frac, proj in ((0.25, 2.3), (0.5, 2.2), (1.0, 2.1)):
        led.emit("tgt", "forecast", {"target_run": "tgt", "fraction": frac, "target_tokens": int(frac * 1e6), "projected_loss": proj,
                                     "band_low": proj - 0.1, "band_high": proj + 0.1, "fit": {"E": 2.0, "A": 100.0, "alpha": 0.1},
                                     "rungs": [f"rung-{r}" for r, _ in RUNGS]}, None, T0, producer="ladder")
    led.write()


@pytest.fixture(scope="module")
def charts_served(tmp_path_factory):
    from runledger.ledger.bus.natsserver import NatsServer

    tmp = tmp_path_factory.mktemp("charts")
    write_chart_runs(tmp / "ledger")
    nats = NatsServer(tmp / "nats").start()
    try:
        ui = UiProcess(tmp / "ledger", tmp / "ui.log", "--nats", nats.url, "--token", TOKEN,
                       env={**os.environ, "XDG_CACHE_HOME": str(tmp / "cache")})
    except BaseException:
        nats.stop()
        raise
    try:
        yield ui.base
    finally:
        ui.stop()
        nats.stop()


def open_view(driver, base: str, view: str) -> None:
    """A new document (so that its resource timings are this load's alone) on `view`, drawn and painted."""
    driver.get(f"{base}/?token={TOKEN}&r={time.monotonic_ns()}#{view}")
    wait(driver, lambda d: d.execute_script(f"return document.body.dataset.ready === '1' && location.hash === '#{view}'"),
         what=f"the view {view}")


def labels(driver, title: str) -> dict:
    wait(driver, lambda d: d.execute_script(
        "const c = window.rlCharts.find(c => c.title.startsWith(arguments[0])); return !!(c && c.labels.canvas)", title),
        what=f"the chart {title!r} drawn")
    return driver.execute_script("return window.rlCharts.find(c => c.title.startsWith(arguments[0])).labels", title)


def meets(a: dict, b: dict) -> bool:
    return a["x0"] < b["x1"] and b["x0"] < a["x1"] and a["y0"] < b["y1"] and b["y0"] < a["y1"]


def assert_readable(got: dict) -> None:
    """No two tick labels of one axis equal, none outside the canvas, no two label boxes intersecting."""
    w, h = got["canvas"]["width"], got["canvas"]["height"]
    boxes = []
    for axis in got["axes"]:
        texts = [b["text"] for b in axis["boxes"]]
        assert len(texts) >= 2, f"axis {axis['scale']}: fewer than two labels: {texts}"
        assert len(set(texts)) == len(texts), f"axis {axis['scale']} repeats a tick label: {texts}"
        boxes += axis["boxes"]
    boxes += [{**m, "text": m["label"]} for m in got["markers"]]
    for b in boxes:
        assert 0 <= b["x0"] and b["x1"] <= w and 0 <= b["y0"] and b["y1"] <= h, f"{b['text']!r} leaves the {w}x{h} canvas: {b}"
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not meets(a, b), f"the labels {a['text']!r} and {b['text']!r} intersect: {a} {b}"


def inked(driver, title: str) -> list[int]:
    """For each decision label placed on the chart, the dark pixels drawn inside its box (its text's ink: the
    box's background is white, the series' colours and the grid are light, the marker line is outside)."""
    return driver.execute_script("""
        const c = window.rlCharts.find(c => c.title.startsWith(arguments[0])), ctx = c.plot.ctx, r = devicePixelRatio;
        return c.labels.markers.map(m => {
          const d = ctx.getImageData(Math.round(m.x0 * r), Math.round(m.y0 * r), Math.round((m.x1 - m.x0) * r),
                                     Math.round((m.y1 - m.y0) * r)).data;
          let n = 0;
          for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 128 && d[i] < 90 && d[i + 1] < 90 && d[i + 2] < 90) n++;
          return n;
        });""", title)


def test_a_system_chart_of_close_values_labels_each_tick_distinctly_and_inside_the_canvas(charts_served, chromium):
    open_view(chromium, charts_served, "/run/sys")
    got = labels(chromium, "system: gpu/0/temp")
    assert_readable(got)
    ys = [b["text"] for b in got["axes"][1]["boxes"]]
    assert all(t.startswith("41.2") for t in ys), ys  # 41.200, 41.205, ... : the digits the ticks need
    assert_readable(labels(chromium, "system: proc/rss_bytes"))  # 7.25e9 + 1e4·k: ten-digit values a step apart


def test_the_ladders_fitted_law_puts_flops_on_a_log_axis(charts_served, chromium):
    open_view(chromium, charts_served, "/ladder/lad")
    got = labels(chromium, "L = E + A")
    assert got["axes"][0]["distr"] == 3  # FLOPs 2e13 .. 2e16 (and the law to 10x that): log
    assert_readable(got)


def test_decision_labels_close_together_meet_no_other_label_and_stay_in_the_plot(charts_served, chromium):
    open_view(chromium, charts_served, "/run/sys")
    got = labels(chromium, "Learning rate")
    assert_readable(got)
    shown = [m["label"] for m in got["markers"]] + got["hidden"]
    assert len(shown) == len(DECISIONS)  # each decision labelled: on the chart, or in the line under it
    assert got["markers"], "no decision label on the chart"
    assert all(n >= 10 for n in inked(chromium, "Learning rate")), "a label's text is not drawn in its box"
    if got["hidden"]:
        legend = chromium.execute_script("return window.rlCharts.find(c => c.title.startsWith('Learning rate')).legendEl.textContent")
        assert all(h in legend for h in got["hidden"])


def test_one_page_load_asks_for_each_charts_points_once(charts_served, chromium):
    open_view(chromium, charts_served, "/run/sys")
    wait(chromium, lambda d: chart_points(d, "loss") == STEPS, what="the loss chart's points")
    time.sleep(SETTLE_S)  # (a late request, as a zoom handler's after the first draw, would be counted)
    urls = chromium.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name).filter(n => n.includes('/series'))")
    asked = []
    for url in urls:
        q = parse_qs(urlparse(url).query)
        asked += [(q["source"][0], k) for k in (q.get("keys", [""])[0].split(",") if q["source"][0] != "drops" else ["drops"])]
    charts = chromium.execute_script("return window.rlCharts.filter(c => c.points() > 0).length")
    assert urls and len(urls) <= charts
    assert len(asked) == len(set(asked)), f"a chart's points asked for twice in one load: {urls}"
    width = "return window.rlCharts.find(c => c.title === 'loss').plot.width"
    before = chromium.execute_script(width)
    try:  # a resize draws again what is held
        chromium.set_window_size(1000, 1000)
        wait(chromium, lambda d: d.execute_script(width) != before, what="the chart drawn at the new width")
        time.sleep(SETTLE_S)
        assert chromium.execute_script(
            "return performance.getEntriesByType('resource').filter(e => e.name.includes('/series')).length") == len(urls)
    finally:
        chromium.set_window_size(1400, 1000)


def test_a_double_click_or_the_reset_button_after_a_zoom_shows_the_full_range(charts_served, chromium):
    from selenium.webdriver.common.action_chains import ActionChains

    open_view(chromium, charts_served, "/run/sys")
    title = "loss"  # (no forecast targets this run: its loss chart is the step's loss)
    wait(chromium, lambda d: chart_points(d, title) == STEPS)
    chart = f"window.rlCharts.find(c => c.title === '{title}')"
    scale = lambda d: d.execute_script(f"const s = {chart}.plot.scales.x; return [s.min, s.max]")  # noqa: E731
    assert scale(chromium) == [1, STEPS]
    for reset in ("double-click", "button"):
        chromium.execute_script(f"{chart}.plot.setScale('x', {{min: 10, max: 20}})")  # (as a drag does)
        wait(chromium, lambda d: d.execute_script(f"return {chart}.el.dataset.zoom") == "10,20", what="the zoomed points")
        assert chart_points(chromium, title) == 11
        button = chromium.execute_script(f"return {chart}.reset")
        assert button.is_displayed()
        if reset == "double-click":
            ActionChains(chromium).double_click(chromium.execute_script(f"return {chart}.plot.over")).perform()
        else:
            button.click()
        wait(chromium, lambda d: scale(d) == [1, STEPS] and chart_points(d, title) == STEPS, what=f"the full range after a {reset}")
        assert not button.is_displayed()


def test_the_favicon_is_served(charts_served):
    with urllib.request.urlopen(f"{charts_served}/favicon.ico", timeout=10) as r:
        assert r.status == 200 and r.headers["content-type"] == "image/x-icon"
        assert r.read(4) == b"\0\0\1\0"  # an ICO file


def svg_labels(driver, which: str) -> dict:
    """The texts (and bars) of the report's SVG whose aria-label starts with `which`: their boxes in its viewBox."""
    return driver.execute_script("""
        const svg = [...document.querySelectorAll('svg')].find(s => (s.getAttribute('aria-label') || '').startsWith(arguments[0]));
        const view = svg.viewBox.baseVal;
        const box = e => { const b = e.getBBox(); return {text: e.textContent, cls: e.getAttribute('class'), x0: b.x, x1: b.x + b.width, y0: b.y, y1: b.y + b.height}; };
        return {w: view.width, h: view.height, texts: [...svg.querySelectorAll('text')].map(box), bars: [...svg.querySelectorAll('rect')].map(box)};""", which)


def assert_svg_readable(got: dict) -> None:
    for t in got["texts"]:
        assert 0 <= t["x0"] and t["x1"] <= got["w"] and 0 <= t["y0"] and t["y1"] <= got["h"], f"{t['text']!r} leaves the chart"
        for bar in got["bars"]:
            assert not meets(t, bar), f"{t['text']!r} is printed over a bar"
    for i, a in enumerate(got["texts"]):
        for b in got["texts"][i + 1:]:
            assert not meets(a, b), f"{a['text']!r} and {b['text']!r} intersect"
    for cls in ("ytick", "xtick"):
        ticks = [t["text"] for t in got["texts"] if t["cls"] == cls]
        assert len(set(ticks)) == len(ticks), f"a {cls} label repeats: {ticks}"


def test_the_reports_charts_print_no_label_over_another_or_a_bar(chromium, tmp_path):
    from runledger.tools.report import write_report

    led = Ledger(tmp_path / "root")
    mixture = {"code": 0.45, "prose": 0.3, "math": 0.15, "multilingual-web": 0.1}
    led.emit("mix", "run_started", {"config": {}, "config_hash": "0" * 64, "data_mixture": mixture, "tokens_per_step": 1000}, 0, T0)
    for k in range(1, STEPS + 1):
        led.emit("mix", "step", {"loss": 3.0, "grad_norm": 1.0, "lr": 1e-3 * min(1.0, k / 10), "tokens": 1000, "step_time_s": 1.0}, k, T0)
        led.emit("mix", "metrics", {"metrics": {"sys/temp": 41.2 + 0.01 * (k % 5)}}, k, T0)
    for i, (k, action) in enumerate(DECISIONS):  # applied one step after each other: the LR chart's marks
        params = {"cf_recv": 1.5} if action == "set_capacity_factor" else {}
        led.emit("mix", "decision", {"decision_id": f"d{i}", "agent": "agent-x", "rule": "r", "action": action, "params": params,
                                     "rationale": "close together", "mode": "auto"}, k, T0, producer="agent-x")
        led.emit("mix", "decision_applied", {"decision_id": f"d{i}", "action": action}, k, T0)
    led.emit("mix", "data", {"tokens_per_domain": {"code": 5200, "prose": 2900, "math": 1400, "multilingual-web": 500}}, 10, T0)
    led.write()
    report = write_report(tmp_path / "root", "mix", tmp_path / "report.html")
    chromium.get(report.as_uri())
    bars = svg_labels(chromium, "Data mixture")
    assert len(bars["bars"]) == 2 * len(mixture) and any("%" in t["text"] for t in bars["texts"])
    assert_svg_readable(bars)
    temp = svg_labels(chromium, "sys/temp")
    assert [t["text"] for t in temp["texts"] if t["cls"] == "ytick"][:2] == ["41.20", "41.21"]
    assert_svg_readable(temp)
    lr = svg_labels(chromium, "Learning rate")
    assert len([t for t in lr["texts"] if t["cls"] == "mlabel"]) >= 2
    assert_svg_readable(lr)
