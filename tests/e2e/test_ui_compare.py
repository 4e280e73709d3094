"""The dashboard's compare view and runs table on runs logged as a user logs them (`runledger.init`, `log`,
`run.config.update` on the embedded local server and ledger), served by `runledger ui` and opened in
Debian's chromium: the config with every config.update applied (the diff names `steps` with the three values
the runs set after they started, the run page says at which step), compare opening on the metrics the runs
share with a picker of every metric they logged, and the runs table's metric columns, sort and selection.

`RUNLEDGER_UI_SCREENSHOT_DIR=docs pytest tests/e2e/test_ui_compare.py` also keeps docs/ui-compare.png and
docs/ui-runs.png (docs/dashboard.md shows them).
"""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from support import REPO
from support.browser import chart_points, chromium, wait  # noqa: F401 (chromium: a fixture)
from support.reading import wait_for_count
from support.ui import UiProcess

STEPS = {"mlp-a": 3000, "mlp-b": 600, "mlp-c": 1500}  # each run's `steps`, set by config.update after its start
CHANGED_AT = 10  # the last step each run logged before its config.update (the step the event is recorded at)


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """Four runs logged through `runledger.init` on an embedded root (three with a config.update of `steps`,
    grouped as a sweep; one with a metric of its own), then `runledger ui` over the root."""
    import runledger
    from runledger.ledger import local

    tmp = tmp_path_factory.mktemp("compare")
    root = tmp / "root"
    with pytest.MonkeyPatch.context() as mp:
        for var in ("RUNLEDGER_NATS", "RUNLEDGER_CREDS"):
            mp.delenv(var, raising=False)
        mp.setenv("RUNLEDGER_ROOT", str(root))
        ids = {}
        try:
            for i, (name, steps) in enumerate([*STEPS.items(), ("baseline", None)]):
                run = runledger.init(project="cmp", name=name, config={"lr": 0.01, "steps": 100, "model": {"width": 64}},
                                     group=None if steps is None else "sweep", job_type="train", system_metrics=False)
                for k in range(1, 31):
                    metrics = {"train/loss": 2.0 / (1 + 0.1 * k) + 0.1 * i, "train/acc": 0.5 + 0.01 * k * (i + 1),
                               "val/loss": 2.2 / (1 + 0.1 * k)}
                    if steps is None:
                        metrics["extra/only_here"] = float(k)
                    runledger.log(metrics, step=k)
                    if k == CHANGED_AT and steps is not None:
                        run.config.update({"steps": steps, "seed": i})
                assert run.finish()
                ids[name] = run.run_id
            wait_for_count(root, "select count(*) from runs_finished", 4, timeout=60)
            wait_for_count(root, "select count(*) from config_updates", 3, timeout=60)
        finally:
            local.down(root)
    ui = UiProcess(root, tmp / "ui.log")
    try:
        yield {"base": ui.base, "ids": ids, "root": root}
    finally:
        ui.stop()


def get(logged, path: str) -> dict:
    req = urllib.request.Request(logged["base"] + path, headers={"x-requested-with": "runledger"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def open_page(driver, logged, fragment: str) -> None:
    """Load the page afresh (a new query: not a mere change of the #fragment) at `fragment`, and wait until it is drawn."""
    logged["loads"] = logged.get("loads", 0) + 1
    driver.get(f"{logged['base']}/?load={logged['loads']}#{fragment}")
    wait(driver, lambda d: d.execute_script("return document.body.dataset.ready === '1'"), what=fragment)


def keep_screenshot(driver, name: str) -> None:
    """The page as it is, kept in $RUNLEDGER_UI_SCREENSHOT_DIR (a folder of the repository, e.g. docs) when set."""
    folder = os.environ.get("RUNLEDGER_UI_SCREENSHOT_DIR")
    if folder:
        (REPO / folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(REPO / folder / name))


def test_the_config_diff_names_steps_set_by_config_update_with_the_three_values(logged, chromium):
    ids = logged["ids"]
    three = [ids[n] for n in STEPS]
    got = get(logged, "/api/compare?runs=" + ",".join(three))
    diff = {d["key"]: d["values"] for d in got["diff"]}
    assert diff["steps"] == {ids[n]: v for n, v in STEPS.items()}  # not init's 100: "the configs are the same" no more
    assert set(diff) == {"steps", "seed"}  # lr and model.width are the same in all three
    history = get(logged, f"/api/run/{ids['mlp-b']}/config")
    assert history["config"]["steps"] == 600 and history["config"]["model"] == {"width": 64}
    [change] = [c for c in history["changes"] if c["key"] == "steps"]
    assert change == {"key": "steps", "step": CHANGED_AT, "attempt": 0, "before": 100, "after": 600, "new": False}
    # in the browser: the diff table, then the run page's config panel
    open_page(chromium, logged, f"/compare/{','.join(three)}")
    rows = [[td.text for td in tr.find_elements("css selector", "td")]
            for tr in chromium.find_elements("css selector", "#diff tbody tr")]
    assert ["steps", "3000", "600", "1500"] in rows, rows
    assert "configs are the same" not in chromium.find_element("css selector", "#diff").text
    heads = [th.text for th in chromium.find_elements("css selector", "#diff thead th")]
    assert heads == ["key", *STEPS]  # the runs by their names
    open_page(chromium, logged, f"/run/{ids['mlp-b']}")
    wait(chromium, lambda d: "set during the run" in (d.find_element("css selector", "#config").get_attribute("textContent") or ""),
         what="config panel")
    panel = chromium.find_element("css selector", "#config")
    step_row = next(tr for tr in panel.find_elements("css selector", "tbody tr")
                    if tr.find_element("css selector", "td").get_attribute("textContent") == "steps")
    text = step_row.get_attribute("textContent")
    assert "600" in text and f"at step {CHANGED_AT}" in text and "was 100" in text, text


def test_compare_opens_on_the_metrics_the_runs_share_with_a_filled_picker_and_redraws_on_a_pick(logged, chromium):
    ids = logged["ids"]
    two = [ids["mlp-a"], ids["baseline"]]
    open_page(chromium, logged, f"/compare/{','.join(two)}")  # no metric in the address
    shown = chromium.execute_script("return window.rlCompare")
    assert shown["source"] == "metrics" and shown["keys"] and all(k.startswith("train/") for k in shown["keys"])
    first = shown["keys"][0]
    assert chart_points(chromium, first) == 2 * 30  # both runs' 30 steps, none lost
    labels = chromium.execute_script("return window.rlCharts[0].plot.series.slice(1).map(s => s.label)")
    assert labels == ["mlp-a · attempt 0", "baseline · attempt 0"]  # the legend: display name · attempt
    options = chromium.execute_script("return [...document.querySelectorAll('#c-pick option')].map(o => o.value).filter(v => v)")
    assert {"metrics\ttrain/loss", "metrics\ttrain/acc", "metrics\tval/loss", "metrics\textra/only_here"} <= set(options)
    # the search box narrows the picker; picking a metric draws it
    search = chromium.find_element("css selector", "#c-search")
    search.send_keys("only")
    assert chromium.execute_script("return [...document.querySelectorAll('#c-pick option')].filter(o => o.value).length") == 1
    search.send_keys(*["\b"] * 4, "val/")
    assert chromium.execute_script("return [...document.querySelectorAll('#c-pick option')].filter(o => o.value).length") == 1
    chromium.execute_script("const p = document.getElementById('c-pick'); p.value = 'metrics\\tval/loss'; p.dispatchEvent(new Event('change'))")
    wait(chromium, lambda d: d.execute_script(
        "return document.body.dataset.ready === '1' && window.rlCharts.length === 1 && window.rlCharts[0].title === 'val/loss'"), what="val/loss")
    assert chart_points(chromium, "val/loss") == 60 and "keys=val%2Floss" in chromium.current_url


def test_a_group_is_drawn_as_its_mean_with_a_min_max_band(logged, chromium):
    ids = logged["ids"]
    runs = ",".join(ids[n] for n in [*STEPS, "baseline"])
    open_page(chromium, logged, f"/compare/{runs}?source=metrics&keys=train/loss&group=1")
    labels = chromium.execute_script("return window.rlCharts[0].plot.series.slice(1).map(s => s.label)")
    assert labels == ["baseline · attempt 0", "sweep · mean of 3 runs", "sweep · min", "sweep · max"]
    mean, lo, hi = chromium.execute_script("const t = window.rlCharts[0].tables; return ['sweep · mean of 3 runs', 'sweep · min', 'sweep · max'].map(n => t.get(n)[1])")
    # the three runs' train/loss differ by 0.1 per run (i = 0, 1, 2): the mean is the middle one, the band 0.2 wide
    assert all(abs(h - lw - 0.2) < 1e-9 and abs(m - (lw + 0.1)) < 1e-9 for m, lw, h in zip(mean, lo, hi))
    assert chromium.execute_script("return window.rlCharts[0].plot.bands.length") == 1
    x = chromium.execute_script("const u = window.rlCharts[0].plot; return [u.scales.x.min, u.scales.x.max]")
    assert x == [1, 30]  # drawn over the steps (a band added after the first draw once left the x scale unset)
    assert chromium.find_element("css selector", "#c-group").is_selected()
    keep_screenshot(chromium, "ui-compare.png")


def test_the_runs_table_shows_metric_columns_sorts_and_opens_compare_on_the_selected_rows(logged, chromium):
    ids = logged["ids"]
    open_page(chromium, logged, "/")
    wait(chromium, lambda d: len(d.find_elements("css selector", "a.run-link")) == 4, what="runs")
    heads = [th.get_attribute("data-col") for th in chromium.find_elements("css selector", "#runs th.sortable")]
    assert {"m:train/loss", "m:train/acc"} <= set(heads) and {"group", "job type", "duration", "state", "attempts"} <= set(heads)
    names = lambda: chromium.execute_script("return [...document.querySelectorAll('a.run-link')].map(a => a.textContent)")  # noqa: E731
    assert set(names()) == {*STEPS, "baseline"}  # display names, the ids beneath
    assert {e.text for e in chromium.find_elements("css selector", ".run-id")} == set(ids.values())
    # train/loss's last value is 2/(1+3) + 0.1 i: sorted up by it, the runs come in the order they were logged
    chromium.find_element("css selector", "th[data-col='m:train/loss']").click()
    wait(chromium, lambda d: names() == ["mlp-a", "mlp-b", "mlp-c", "baseline"], what="sorted up")
    chromium.find_element("css selector", "th[data-col='m:train/loss']").click()
    wait(chromium, lambda d: names() == ["baseline", "mlp-c", "mlp-b", "mlp-a"], what="sorted down")
    # a column's filter
    f = chromium.find_element("css selector", "input.col-filter[data-col='group']")
    f.send_keys("sweep")
    wait(chromium, lambda d: sorted(names()) == sorted(STEPS), what="filtered by group")
    f.clear()
    f.send_keys(" ")  # (an input event: the filter emptied)
    wait(chromium, lambda d: len(names()) == 4, what="unfiltered")
    # a metric column added from the picker
    add = chromium.find_element("css selector", "#f-metric")
    add.send_keys("extra/only_here\n")
    wait(chromium, lambda d: d.find_elements("css selector", "th[data-col='m:extra/only_here']"), what="added column")
    row = chromium.find_element("css selector", f"tr[data-run='{ids['baseline']}']")
    assert "30" in [td.text for td in row.find_elements("css selector", "td")]  # its last value
    keep_screenshot(chromium, "ui-runs.png")
    # selecting two rows makes Compare prominent, and it opens compare on them
    for n in ("mlp-a", "mlp-c"):
        chromium.find_element("css selector", f"input.pick[value='{ids[n]}']").click()
    button = chromium.find_element("css selector", "#compare")
    assert "prominent" in button.get_attribute("class") and "(2)" in button.text
    button.click()
    wait(chromium, lambda d: d.execute_script("return document.body.dataset.ready === '1' && location.hash.startsWith('#/compare/')"),
         what="compare")
    opened = chromium.execute_script("return decodeURIComponent(location.hash.split('/')[2].split('?')[0]).split(',')")
    assert sorted(opened) == sorted([ids["mlp-a"], ids["mlp-c"]])
    assert chromium.find_elements("css selector", "#diff tbody tr")
