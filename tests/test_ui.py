"""The dashboard (`runledger ui`): its access rules and its downsampling on a ledger written by the real
writer, then the whole thing in Debian's chromium: a real nats-server, a real ledger process, the UI
served by `runledger ui` on a non-loopback address with a token, and an Emitter logging while the page
is open. One browser and one server for the module.

`RUNLEDGER_UI_SCREENSHOT=docs/ui.png pytest tests/test_ui.py -k charts` also keeps the run page's
screenshot there (the README's first screen).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from audit_ledger import T0, Ledger
from conftest import REPO, LedgerProcess, wait_for_count
from runledger.ui.access import configure
from runledger.ui.app import create_app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
TOKEN, READ_TOKEN = "write-token-0123456789abcdef", "read-token-0123456789abcdef"
LOSS_RGB = (0xD6, 0x27, 0x28)  # the first series' color (app.js COLORS[0]): attempt 0's loss line
LIVE_S = 2.0  # the issue: a step logged while the page is open appears within 2 s


# ------------------------------------------------------------------------------------ unit: access rules
@pytest.fixture
def small_root(tmp_path) -> Path:
    """Two runs written by the real writer: `spiky` (3,000 steps, one spike, two attempts) and `flat`."""
    led = Ledger(tmp_path / "root")
    for attempt, (first, last) in enumerate([(1, 1500), (1001, 2500)]):
        led.emit("spiky", "run_started", {"config": {"lr": 1e-3, "layers": 2 + attempt}, "config_hash": "0" * 64,
                                          "tags": ["ui", "spike"]}, first - 1, T0, attempt=attempt)
        for k in range(first, last + 1):
            loss = 50.0 if (attempt == 1 and k == 1777) else 3.0 - k * 1e-4
            led.emit("spiky", "step", {"loss": loss, "grad_norm": 1.0, "lr": 1e-3, "tokens": 10, "step_time_s": 1.0},
                     k, T0 + timedelta(seconds=k), attempt=attempt)
    led.emit("flat", "run_started", {"config": {"lr": 1e-3, "layers": 4}, "config_hash": "0" * 64}, 0, T0)
    led.emit("flat", "metrics", {"metrics": {"train/loss": 2.5, "acc": 0.5}}, 1, T0)
    led.write()
    return tmp_path / "root"


def client(root: Path, host: str, **tokens) -> TestClient:
    """The app as the page calls it: every request with the header no other origin's page can send."""
    return TestClient(create_app(root, None, configure(host, **tokens)), base_url="http://127.0.0.1:8765",
                      headers={"x-requested-with": "runledger"})


def test_a_non_loopback_ui_refuses_every_request_without_its_token(small_root):
    with pytest.raises(ValueError, match="not loopback"):
        configure("0.0.0.0")
    with client(small_root, "0.0.0.0", token=TOKEN, read_token=READ_TOKEN) as c:
        for path in ("/api/runs", "/api/run/spiky", "/api/run/spiky/series?source=step&keys=loss", "/api/live",
                     "/api/sql?q=select%201", "/api/run/spiky/audit/health", "/api/nowhere"):
            assert c.get(path).status_code == 401, path
            assert c.get(path, headers={"authorization": "Bearer wrong-token-0123456789"}).status_code == 401, path
        assert c.post("/api/decide", json={}).status_code == 401
        ok = c.get("/api/runs", headers={"authorization": f"Bearer {READ_TOKEN}"})
        assert ok.status_code == 200 and {r["run_id"] for r in ok.json()["runs"]} == {"spiky", "flat"}
        assert c.get("/api/runs", headers={"x-runledger-token": READ_TOKEN}).status_code == 200
        # the page and its code hold no data; the page takes ?token= itself (no cookie is set)
        for path in ("/", f"/?token={TOKEN}", "/static/app.js", "/static/uPlot.iife.min.js"):
            page = c.get(path, follow_redirects=False)
            assert page.status_code == 200 and "set-cookie" not in page.headers, path
        assert c.get("/api/runs").status_code == 401


def test_approve_and_reject_need_the_read_write_token_in_a_header(small_root):
    with client(small_root, "0.0.0.0", token=TOKEN, read_token=READ_TOKEN) as c:
        body = {"run": "spiky", "decision_id": "nope", "action": "approve", "by": "ada"}
        refused = c.post("/api/decide", json=body, headers={"x-runledger-token": READ_TOKEN})
        assert refused.status_code == 403 and "read-only" in refused.text
        assert c.post("/api/decide", json=body).status_code == 401  # no token
        assert c.post("/api/decide", json=body, headers={"x-runledger-token": "forged-0123456789abcdef"}).status_code == 401
        writer = {"x-runledger-token": TOKEN}
        assert c.post("/api/decide", json=body, headers={**writer, "origin": "http://evil.example"}).status_code == 403
        # past the guards: refused for what it is (no NATS here, and no such decision)
        assert c.post("/api/decide", json=body, headers=writer).status_code in (409, 503)


def test_a_loopback_ui_answers_only_to_a_loopback_host_and_still_needs_a_token_to_decide(small_root):
    with client(small_root, "127.0.0.1") as c:
        assert c.get("/api/runs").status_code == 200
        assert c.get("/api/runs", headers={"host": "evil.example:8765"}).status_code == 403  # DNS rebinding
        assert c.post("/api/decide", json={}).status_code in (401, 403)


def test_the_runs_list_filters_by_name_tag_status_and_config_key(small_root):
    with client(small_root, "127.0.0.1") as c:
        ids = lambda q: [r["run_id"] for r in c.get(f"/api/runs?{q}").json()["runs"]]  # noqa: E731
        assert sorted(ids("")) == ["flat", "spiky"]
        assert ids("name=PIK") == ["spiky"] and ids("tag=spike") == ["spiky"] and ids("tag=none") == []
        assert ids("config=layers%3D4") == ["flat"] and ids("config=lr%3D0.001") in (["spiky", "flat"], ["flat", "spiky"])
        assert ids("status=silent") and ids("status=completed") == []  # (written long ago, never finished)
        spiky = next(r for r in c.get("/api/runs").json()["runs"] if r["run_id"] == "spiky")
        assert spiky["attempts"] == 2 and spiky["last_step"] == 2500 and spiky["tags"] == ["ui", "spike"]
        assert c.get("/api/runs?config=bad%20key%3D1").status_code == 400


def test_the_ladder_view_has_its_rungs_and_the_targets_forecast_against_its_actual(tmp_path):
    from audit_ledger import write_run

    led = Ledger(tmp_path / "root")
    write_run(led, "rung-a", ladder="lad")
    write_run(led, "target", ladder="lad", forecasts="hit")
    led.write()
    with client(tmp_path / "root", "127.0.0.1") as c:
        assert c.get("/api/ladders").json()["ladders"][0]["ladder"] == "lad"
        got = c.get("/api/ladder/lad").json()
        assert {r["run_id"] for r in got["rungs"]} == {"rung-a", "target"}
        [target] = got["targets"]
        assert target["target"] == "target" and target["fit"]["rungs"] == ["rung-a"]
        reached = [p for p in target["points"] if p["reached"]]
        assert reached and all(p["observed_loss"] is not None and p["inside_band"] for p in reached)


def test_downsampling_keeps_every_spike_and_is_exact_once_zoomed_in(small_root):
    with client(small_root, "127.0.0.1") as c:
        got = c.get("/api/run/spiky/series?source=step&keys=loss&px=100").json()
        attempts = got["keys"]["loss"]
        assert set(attempts) == {"0", "1"}  # attempts drawn as attempts, not mixed
        xs, ys = attempts["1"]
        assert 50.0 in ys and xs[ys.index(50.0)] == 1777  # the one spike among 1,500 steps
        assert len(xs) <= 4 * 101 and len(attempts["0"][0]) <= 4 * 101
        zoom = c.get("/api/run/spiky/series?source=step&keys=loss&px=100&x0=1750&x1=1799").json()["keys"]["loss"]
        assert zoom["1"][0] == list(range(1750, 1800)) and "0" not in zoom
        free = c.get("/api/run/flat/series?source=metrics&keys=train/loss,acc").json()["keys"]
        assert free["train/loss"]["0"] == [[1], [2.5]] and free["acc"]["0"] == [[1], [0.5]]
        diff = c.get("/api/compare?runs=spiky,flat&key=loss").json()["diff"]
        assert [d["key"] for d in diff] == ["layers"]  # only the keys that differ
        assert c.get("/api/sql?q=delete%20from%20steps").status_code == 400  # the guard of `runledger sql`


def _same_rows(got: dict, reference: list[dict]) -> None:
    """The runs page's rows (put together from each file's parts) against ui/runs.sql over the whole views."""
    assert sorted(got) == sorted(r["run_id"] for r in reference)
    for ref in reference:
        row = got[ref["run_id"]]
        for col, want in ref.items():
            have = row[col]
            if col in ("started_at", "last_event"):  # (the same instant: the zone's spelling may differ)
                have, want = datetime.fromisoformat(have), datetime.fromisoformat(want)
            assert have == want, (ref["run_id"], col)


def test_the_runs_rows_come_from_each_files_parts_kept_across_restarts_and_equal_runs_sql(tmp_path, monkeypatch):
    from audit_ledger import write_run

    from runledger.ui.data import Reader
    from runledger.ui.runs import FILE_PARTS
    from runledger.ui.snapshot import load

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    led = Ledger(tmp_path / "root")
    write_run(led, "rung-a", ladder="lad")
    write_run(led, "forked", parent={"run_id": "rung-a", "step": 100, "content_hash": f"{100:064x}"})
    for i, (state, severity) in enumerate([("open", "warn"), ("open", "fail"), ("resolved", "fail")]):
        led.emit("rung-a", "alert", {"alert_id": f"a{i}", "agent": "watch", "rule": "r", "severity": severity,
                                     "state": "open", "message": "m"}, 10 + i, T0 + timedelta(seconds=i))
        led.emit("rung-a", "alert", {"alert_id": f"a{i}", "agent": "watch", "rule": "r", "severity": severity,
                                     "state": state, "message": "m"}, 20 + i, T0 + timedelta(seconds=20 + i))
    led.write()
    root = tmp_path / "root"
    first = Reader(root, threads=1)
    try:
        rows = first.summaries()
        _same_rows(rows, first.rows(load("runs")))
        assert rows["rung-a"]["alerts_warn"] == 1 and rows["rung-a"]["alerts_fail"] == 1  # (a2 was resolved)
        assert rows["forked"]["parents"] == ["rung-a"] and rows["rung-a"]["ladder"] == "lad"
    finally:
        first.close()
    # a restart: every listed file's parts come from the cache folder, before anything is read
    write_run(led, "later", first=1, last=20, finish=False)
    led.write()
    again = Reader(root, threads=1)
    try:
        kept, files = set(again.index.parts), again.run_files()  # (the kinds the runs page reads)
        listed = {str(f) for r in files.values() for kind, fs in r.items() if kind in FILE_PARTS for f in fs}
        new = {str(f) for kind, fs in files["later"].items() if kind in FILE_PARTS for f in fs}
        assert listed - new <= kept and not new & kept  # only the new run's files are still to be read
        rows = again.summaries()
        assert new <= set(again.index.parts)
        _same_rows(rows, again.rows(load("runs")))
        assert rows["later"]["finished"] is None and rows["later"]["last_step"] == 20
    finally:
        again.close()


def test_the_health_counts_of_many_runs_come_in_one_pass_equal_to_each_runs_checklist(small_root):
    with client(small_root, "127.0.0.1") as c:
        got = c.get("/api/health?runs=spiky,flat,nosuchrun").json()["health"]
        assert sorted(got) == ["flat", "spiky"]
        for run in ("spiky", "flat"):
            counts = {"ok": 0, "warn": 0, "fail": 0, "skip": 0}
            for result in c.get(f"/api/run/{run}/audit/health").json()["results"]:
                for row in result["rows"]:
                    counts[row[2]] += 1
            assert got[run] == counts and sum(counts.values()) > 0
        assert c.get("/api/health?runs=bad%20name").status_code == 400


# ------------------------------------------------------------------------------------ the browser
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A nats-server, a ledger process, a worker's and an agent's Emitters, and `runledger ui`."""

    def __init__(self, tmp: Path):
        from runledger.ledger.emit.emitter import Emitter
        from runledger.ledger.bus.natsserver import NatsServer

        self.tmp, self.root = tmp, tmp / "ledger"
        self.root.mkdir()
        self.nats = NatsServer(tmp / "nats").start()
        self.ledger = LedgerProcess(self.root, self.nats.url, tmp / "ledger.log").start()
        self.worker = Emitter("alpha", "worker-0", 0, self.nats.url, tmp / "spool")
        self.agent = Emitter("alpha", "agent-drops", 0, self.nats.url, tmp / "spool")
        self.ui = None
        self.step = 0

    def write_runs(self) -> None:
        from runledger.ledger.emit.emitter import Emitter
        from runledger.ledger.contract.events import (DecisionMade, ForecastMade, MetricsLogged, ResumedFrom, RunStarted)

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

    def start_ui(self) -> str:
        port = free_port()
        self.ui_log = open(self.tmp / "ui.log", "ab")
        self.ui = subprocess.Popen(
            [sys.executable, "-m", "runledger.tools.cli", "ui", "--root", str(self.root), "--nats", self.nats.url,
             "--host", "0.0.0.0", "--port", str(port), "--token", TOKEN, "--read-token", READ_TOKEN],
            cwd=REPO, stdout=subprocess.PIPE, stderr=self.ui_log, text=True)
        line = self.ui.stdout.readline()  # the address, once it listens
        assert line.startswith("http://"), (self.tmp / "ui.log").read_text()
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        for em in (self.worker, self.agent):
            em.close(timeout=5)
        if self.ui is not None:
            self.ui.terminate()
            self.ui.wait(10)
            self.ui.stdout.close()
            self.ui_log.close()
        self.ledger.kill()
        self.nats.stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = Served(tmp_path_factory.mktemp("ui"))
    try:
        s.write_runs()
        s.base = s.start_ui()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def chromium():
    """Debian's headless chromium through chromedriver (a test that takes it is slow: a browser starts)."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("Debian's chromium and chromium-driver are not installed (make test installs them when run as root)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run", "--disable-sync", "--window-size=1400,1000",
                f"--user-data-dir={tempfile.mkdtemp()}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    yield driver
    driver.quit()


def wait(driver, condition, timeout: float = 20.0, what: str = ""):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition, what)


def chart_points(driver, title: str) -> int:
    return driver.execute_script(
        "const c = (window.rlCharts || []).find(c => c.title === arguments[0]); return c ? c.points() : -1;", title)


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
    assert chart_points(chromium, "metrics: eval/acc") == 55
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


def test_a_step_logged_while_the_page_is_open_appears_without_a_reload(served, chromium):
    chromium.get(f"{served.base}/?token={TOKEN}#/run/alpha")
    wait(chromium, lambda d: chart_points(d, "Loss vs forecast band") >= 55)
    wait(chromium, lambda d: "live" in d.find_element("id", "live").get_attribute("class").split(), what="live feed")
    chromium.execute_script("window.__notReloaded = true")
    before = chart_points(chromium, "Loss vs forecast band")
    served.log_step(served.step + 1)
    emitted = time.monotonic()
    wait(chromium, lambda d: chart_points(d, "Loss vs forecast band") == before + 1
         and chart_points(d, "metrics: eval/acc") == before + 1, timeout=LIVE_S,
         what=f"the new step (typed and free-form) on the page within {LIVE_S} s")
    assert time.monotonic() - emitted <= LIVE_S + 0.2
    assert chromium.execute_script("return window.__notReloaded === true")


def test_approving_a_proposed_decision_stores_a_decision_event_with_the_approver(served, chromium):
    from runledger import queries

    from selenium.common.exceptions import StaleElementReferenceException

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


def test_live_points_stop_at_the_ledgers_position_so_a_kind_readable_later_is_not_skipped(tmp_path):
    """One commit makes its kinds' tables readable one after another: a page's live cursor that moved to
    the greatest seq it read (a step) would skip an earlier event of a kind made readable after it (a
    metric). The cursor is the ledger's position, written once the whole commit is readable."""
    from runledger.ledger.storage import positions, store
    from test_store import Producer, step_payload
    from test_verify_replay import RUN, Stream, run_started
    from runledger.ui.data import Reader

    root = tmp_path / "ledger"
    s, w = Stream(), Producer(RUN, "worker-0", 0)
    s.emit(w, "run_started", run_started(), 0)
    s.emit(w, "step", step_payload(5.0), 0)
    s.emit(w, "metrics", {"metrics": {"acc": 0.1}}, 0)  # stream seq 3
    s.emit(w, "step", step_payload(4.9), 1)  # stream seq 4
    store.write_events(root, s.rows[:2])
    positions.write_position(root, 2)
    reader = Reader(root)
    first = reader.new_points(RUN, 0)
    assert first["seq"] == 2 and first["step"]["loss"] == {"0": ([0], [5.0])}
    store.write_events(root, [s.rows[3]])  # the step's table is readable, the metric's not yet
    reader.refresh()
    assert reader.new_points(RUN, 2) == {"seq": 2, "kinds": []}
    store.write_events(root, [s.rows[2]])
    positions.write_position(root, 4)
    reader.refresh()
    news = reader.new_points(RUN, 2)
    assert news["seq"] == 4 and news["metrics"]["acc"] == {"0": ([0], [0.1])} and news["step"]["loss"] == {"0": ([1], [4.9])}
    reader.close()


def test_a_partitioned_roots_run_goes_live_at_its_partitions_position(tmp_path, nats_server):
    """On a root served by `ledger serve --partitions 2` there is no single position: the feed waits for
    the run's own last message to be stored by its partition's writer, and a page's points come up to
    that partition's position."""
    import asyncio

    from runledger.ledger.ingest import partitions
    from runledger.ledger.emit.emitter import Emitter
    from test_store import step_payload
    from runledger.ui.data import Reader
    from runledger.ui.live import Feed

    root = tmp_path / "root"
    ledger = LedgerProcess(root, nats_server.url, tmp_path / "ledger.log", "--partitions", "2").start()
    em = Emitter("r1", "worker-0", 0, nats_server.url, tmp_path / "spool")
    try:
        em.emit_dict("step", step_payload(5.0), step=0)
        assert em.flush(60)
        assert wait_for_count(root, "select count(*) from steps_all", 1) == 1

        async def follow() -> list[int]:
            reader = Reader(root)
            feed = Feed(reader, nats_server.url)
            await feed.start()
            try:
                since, seen = 0, []
                for step in range(1, 4):
                    version = feed.version
                    await asyncio.to_thread(lambda: em.emit_dict("step", step_payload(5.0 - step), step=step) or em.flush(60))
                    deadline = time.monotonic() + 30
                    while step not in seen and time.monotonic() < deadline:
                        if await feed.wait_change(version, 1.0):
                            version = feed.version
                        news = await asyncio.to_thread(reader.new_points, "r1", since)
                        since = news["seq"]
                        seen += news.get("step", {}).get("loss", {}).get("0", ([], []))[0]
                assert "" not in reader.positions and since == partitions.stored_upto(reader.positions, "r1") > 0
                return seen
            finally:
                await feed.stop()
                reader.close()

        assert asyncio.run(follow()) == [0, 1, 2, 3]
    finally:
        em.close(timeout=10)
        ledger.kill()
