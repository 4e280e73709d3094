"""browser: Debian's headless chromium through chromedriver, for every test that opens a page (tests/support:
every helper defined once). A module takes the fixture with `from support.browser import chromium, wait`."""

from __future__ import annotations

import shutil
import tempfile

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


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
    """Poll `condition(driver)` every 50 ms until it is truthy (its value), or fail after `timeout` s."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition, what)


def chart_points(driver, title: str) -> int:
    """The points the page's chart of that title holds (-1: no such chart)."""
    return driver.execute_script(
        "const c = (window.rlCharts || []).find(c => c.title === arguments[0]); return c ? c.points() : -1;", title)
