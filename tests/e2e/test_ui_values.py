"""A run page's logged values in Debian's chromium: a loop logging a histogram, a table and an image each step and
printing (through `runledger.init/log`, a real nats-server and ledger process, served by `runledger ui` with a token)
shows the histogram as a heat map over its steps, the table at its last step with a search that narrows its rows,
the image decoded from the blob the run names (its pixels read back from the page's <img>), and the console."""

from __future__ import annotations

import numpy as np
import pytest

from support.browser import chromium, wait  # noqa: F401 (chromium: a fixture)
from support.reading import wait_for_count
from support.ui import UiStack

STEPS = 6
PIXELS = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3) * 4


class ValuesPage(UiStack):
    def log_run(self) -> None:
        import runledger

        run = runledger.init(project="rich", id="rich", root=self.root, nats=self.nats.url, system_metrics=False)
        rng = np.random.default_rng(0)
        for step in range(STEPS):
            rows = [[f"prompt {i}", f"output {i} at {step}", i * 0.5] for i in range(5)]
            runledger.log({"loss": 1.0 / (step + 1), "acts": rng.normal(loc=step, size=300),
                           "gens": runledger.Table(columns=["prompt", "output", "score"], data=rows),
                           "sample": runledger.Image(PIXELS, caption=f"step {step}")}, step=step)
            print(f"finished step {step}")
        assert run.finish()
        wait_for_count(self.root, "select count(*) from histograms where run_id = 'rich'", STEPS, timeout=60)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    s = ValuesPage(tmp_path_factory.mktemp("values"))
    try:
        s.log_run()
        s.url = s.start_ui().line
        yield s
    finally:
        s.stop()


def test_the_run_page_shows_the_heat_map_the_table_the_image_and_the_console(page, chromium):
    base = page.url.split("#")[0]
    chromium.get(f"{base}#/run/rich")
    wait(chromium, lambda d: d.execute_script("return document.querySelector('.heat canvas') !== null"), what="heat map")
    heat = chromium.execute_script("const c = document.querySelector('.heat canvas'); const d = c.getContext('2d')"
                                   ".getImageData(0, 0, c.width, c.height).data; let inked = 0;"
                                   "for (let i = 3; i < d.length; i += 4) inked += d[i] > 0;"
                                   "return [c.width, c.height, inked, document.querySelector('.heat').dataset.key];")
    assert heat[:2] == [STEPS, 48] and heat[2] > STEPS and heat[3] == "acts"  # a column per step, its bands inked
    wait(chromium, lambda d: d.execute_script("return document.querySelectorAll('.logged-table tbody tr').length === 5"),
         what="the table's rows")
    assert chromium.execute_script("return document.querySelector('.logged-table .step').value") == str(STEPS - 1)
    search = chromium.find_element("css selector", ".logged-table .search")
    search.send_keys("output 3")
    wait(chromium, lambda d: d.execute_script("return document.querySelectorAll('.logged-table tbody tr').length === 1"),
         what="the search narrowing the rows")
    assert "output 3 at 5" in chromium.find_element("css selector", ".logged-table tbody").text
    wait(chromium, lambda d: d.execute_script("const i = document.querySelector('.media-grid img'); return i && i.complete "
                                              "&& i.naturalWidth > 0"), what="the image")
    got = chromium.execute_script("const i = document.querySelector('.media-grid img'); const c = document.createElement"
                                  "('canvas'); c.width = i.naturalWidth; c.height = i.naturalHeight; const x = c.getContext"
                                  "('2d'); x.drawImage(i, 0, 0); return [c.width, c.height, Array.from(x.getImageData(0, 0, "
                                  "c.width, c.height).data)];")
    assert got[:2] == [5, 4]
    rgba = np.array(got[2], dtype=np.uint8).reshape(4, 5, 4)
    assert np.array_equal(rgba[:, :, :3], PIXELS)  # the very pixels logged, through the blob
    wait(chromium, lambda d: d.execute_script("return document.getElementById('console').textContent.includes("
                                              f"'finished step {STEPS - 1}')"), what="the console")
