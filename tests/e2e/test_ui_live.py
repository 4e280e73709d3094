"""The dashboard follows the root's server whatever started first (issue 37, item 6), in Debian's chromium:
`runledger ui --root R` with no server named, opened on a root that has none yet; then a user's script
(`runledger.init` on the embedded default, in its own process) starts the root's server and logs a step,
which appears on the open page without a reload; the script ends, the embedded server stops once idle,
the next run's starts on another port, and the same page goes live there by itself and shows that run's
new steps. Meanwhile its badge says each state once: live by polling the tables, via NATS, by polling,
via NATS. How soon a step shows: `python -m bench.ui_live`, not a test (these wait up to WATCHDOG_S)."""

from __future__ import annotations

import json
import urllib.request

from runledger.ledger import local
from support.browser import chart_points, chromium, wait  # noqa: F401 (chromium: a fixture)
from support.embedded import SteeredRun, embedded_env, idled_out, until
from support.reading import reader
from support.ui import UiProcess

WATCHDOG_S = 30.0  # a hang guard, not a promise of speed
START_S = 120.0  # a first nats-server, ledger and run on a loaded machine (SteeredRun's own start)


def page_points(driver) -> int:
    """Every point the page's charts hold."""
    return driver.execute_script("return (window.rlCharts || []).reduce((n, c) => n + c.points(), 0)")


def badge(driver) -> tuple[str, str]:
    """The live badge: its state (data-via: nats, tables or none) and its text."""
    el = driver.find_element("id", "live")
    return el.get_attribute("data-via"), el.text


# the badge's states as the page shows them, each change once (a MutationObserver on its data-via)
WATCH_BADGE = """
const el = document.getElementById('live');
window.__states = [el.dataset.via];
new MutationObserver(() => { if (el.dataset.via !== window.__states.at(-1)) window.__states.push(el.dataset.via); })
  .observe(el, {attributes: true, attributeFilter: ['data-via']});
"""


def ui_status(base: str) -> dict:
    req = urllib.request.Request(f"{base}/api/status", headers={"x-requested-with": "runledger"})
    with urllib.request.urlopen(req, timeout=WATCHDOG_S) as r:
        return json.loads(r.read())


def metrics_stored(root, run_id: str) -> int:
    """The metrics events of the run the ledger has stored."""
    return reader(root).execute("select count(*) from metrics_all where run_id = ?", [run_id]).fetchone()[0]


def open_run_page(driver, root, run_id: str) -> int:
    """Go to the run's page (the address's fragment: no reload) once its first step is stored; its points."""
    wait(driver, lambda d: metrics_stored(root, run_id) >= 1, WATCHDOG_S, "the run's first step in the ledger")
    driver.execute_script("location.hash = arguments[0]", f"#/run/{run_id}")
    return wait(driver, lambda d: d.execute_script("return document.body.dataset.ready === '1' && location.hash")
                and page_points(d) >= 1 and page_points(d), WATCHDOG_S, "the run's page with its first step")


def test_a_dashboard_started_before_any_run_goes_live_and_follows_the_embedded_server_to_its_next_port(
        local_root, tmp_path, chromium):
    root = local_root
    ui = UiProcess(root, tmp_path / "ui.log", env=embedded_env(root))
    base = ui.base
    runs, taken, held = [], None, None
    try:
        chromium.get(f"{base}/#/")
        # no server for the root yet: the page is live by polling the tables, and says so
        via, text = wait(chromium, lambda d: badge(d)[0] == "tables" and badge(d), WATCHDOG_S, "polling, said")
        assert text.startswith("live by polling the tables"), text
        assert local.running_url(root) is None
        chromium.execute_script("window.__notReloaded = true;" + WATCH_BADGE)

        runs.append(first := SteeredRun(root, "first"))  # the user's script starts the root's server
        first.log(0)  # (init does not wait for the server it starts: the page goes live once it is up)
        wait(chromium, lambda d: badge(d)[0] == "nats", WATCHDOG_S, "the page live via the root's server")
        old_url = until(lambda: local.running_url(root))
        assert ui_status(base)["reason"].endswith(old_url)
        before = open_run_page(chromium, root, first.id)
        first.log(1)
        wait(chromium, lambda d: page_points(d) > before, WATCHDOG_S, "step 1 on the page, without a reload")

        held = local.attach(root, idle_s=1)  # (held meanwhile, as by another run: its URL is read while it runs)
        first.finish()
        held.release()  # nothing holds the server now: it stops once idle (RUNLEDGER_IDLE_S=1)
        old_url, taken = idled_out(root)  # (its port kept taken: the next server's differs)
        wait(chromium, lambda d: badge(d)[0] == "tables", WATCHDOG_S, "polling again, once the server stopped")

        runs.append(second := SteeredRun(root, "second"))  # the next run starts a server on a new port
        second.log(0)
        wait(chromium, lambda d: badge(d)[0] == "nats", WATCHDOG_S, "the page live again, by itself")
        new_url = until(lambda: local.running_url(root))
        assert new_url != old_url
        assert ui_status(base)["reason"].endswith(new_url)
        before = open_run_page(chromium, root, second.id)
        second.log(1)
        second.log(2)
        wait(chromium, lambda d: page_points(d) >= before + 2, WATCHDOG_S, "the next run's new steps on the page")
        assert chromium.execute_script("return window.__notReloaded === true")
        # one state at a time, each said once: no flicker through "not live" on the way, nor back and forth
        assert chromium.execute_script("return window.__states") == ["tables", "nats", "tables", "nats"]
        assert ui.proc.poll() is None, (tmp_path / "ui.log").read_text()  # the same dashboard, never restarted
    finally:
        for run in runs:
            run.kill()
        if held is not None:
            held.release()
        ui.stop()
        if taken is not None:
            taken.close()
