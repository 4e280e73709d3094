"""A run page's logged values (`runledger.ui.values`, on a ledger written by the real writer): each histogram's heat
map puts every bucket's count in the band of its middle, a table is answered at a step and searched by its text, and
a blob is served only where one of the run's media events names it, as the type it was logged as (an image) or as a
download, and never once its bytes changed; the console's lines come in order and are searched."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

import runledger
from runledger.ledger.storage.media import blob_path, store_bytes
from runledger.ui.values import HEAT_ROWS
from runledger.values import png_of
from support.audit_ledger import T0, Ledger
from support.ui import client

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)


@pytest.fixture
def rich_root(tmp_path) -> Path:
    root = tmp_path / "root"
    led = Ledger(root)
    led.emit("rich", "run_started", {"config": {}, "config_hash": "0" * 64}, None, T0)
    rng = np.random.default_rng(3)
    for step in range(5):
        h = runledger.Histogram(rng.normal(loc=step, size=200), num_bins=10).payload()
        led.emit("rich", "histogram", {"key": "acts", **h}, step, T0 + timedelta(seconds=step))
        rows = [[f"q{step}-{i}", f"the answer is {i * step}"] for i in range(3)]
        led.emit("rich", "table", {"key": "gens", "columns": ["prompt", "output"], "rows": rows, "rows_logged": 3}, step, T0)
    png = png_of(np.arange(6, dtype=np.uint8).reshape(2, 3))
    digest, size = store_bytes(root, png)
    led.emit("rich", "media", {"key": "img", "sha256": digest, "bytes": size, "type": "image/png"}, 4, T0)
    other, _ = store_bytes(root, b"<svg onload=alert(1)>")
    led.emit("rich", "media", {"key": "svg", "sha256": other, "bytes": 21, "type": "image/svg+xml"}, 4, T0)
    led.emit("rich", "console", {"stream": "stdout", "first": 0, "lines": ["epoch 0", "loss 2.5"]}, 0, T0)
    led.emit("rich", "console", {"stream": "stderr", "first": 0, "lines": ["Warning: slow"]}, 1, T0 + timedelta(seconds=1))
    led.emit("rich", "console", {"stream": "stdout", "first": 7, "lines": ["epoch 1"], "dropped": 5}, 2, T0 + timedelta(seconds=2))
    led.emit("plain", "run_started", {"config": {}, "config_hash": "0" * 64}, None, T0)
    led.write()
    return root


def test_the_heat_map_bands_every_bucket_and_the_table_is_searched(rich_root):
    with client(rich_root, "127.0.0.1") as c:
        info = c.get("/api/run/rich").json()
        assert {"histogram", "table", "media"} <= set(info["kinds"])
        v = c.get("/api/run/rich/values").json()
        (heat,) = v["histograms"]
        assert heat["key"] == "acts" and heat["steps"] == [0, 1, 2, 3, 4] and heat["rows"] == HEAT_ROWS
        assert [sum(col) for col in heat["cells"]] == [200] * 5  # every value in some band
        assert np.argmax(heat["cells"][0]) < np.argmax(heat["cells"][4])  # the mass moves up as the mean does
        assert v["tables"] == [{"key": "gens", "steps": 5, "last_step": 4}]
        assert {m["key"] for m in v["media"]} == {"img", "svg"}
        last = c.get("/api/run/rich/table?key=gens").json()
        assert (last["step"], last["columns"], last["rows"]) == (4, ["prompt", "output"],
                                                                  [[i, [f"q4-{i}", f"the answer is {4 * i}"]] for i in range(3)])
        found = c.get("/api/run/rich/table?key=gens&step=2&q=ANSWER IS 4").json()
        assert found["rows"] == [[2, ["q2-2", "the answer is 4"]]] and found["rows_logged"] == 3
        assert c.get("/api/run/rich/table?key=gens&step=x").status_code == 400


def test_a_blob_is_served_only_where_the_run_names_it_and_only_intact(rich_root):
    png = png_of(np.arange(6, dtype=np.uint8).reshape(2, 3))
    with client(rich_root, "127.0.0.1") as c:
        digest = next(m["sha256"] for m in c.get("/api/run/rich/values").json()["media"] if m["key"] == "img")
        got = c.get(f"/api/run/rich/media/{digest}")
        assert got.status_code == 200 and got.content == png and got.headers["content-type"] == "image/png"
        svg = next(m["sha256"] for m in c.get("/api/run/rich/values").json()["media"] if m["key"] == "svg")
        got = c.get(f"/api/run/rich/media/{svg}")  # a type a browser would run: a download, never a page
        assert got.headers["content-type"] == "application/octet-stream" and "attachment" in got.headers["content-disposition"]
        assert c.get(f"/api/run/plain/media/{digest}").status_code == 404  # another run's blob
        assert c.get("/api/run/rich/media/..%2F..%2Fetc%2Fpasswd").status_code in (400, 404)
        assert c.get(f"/api/run/rich/media/{digest.upper()}").status_code == 400
        blob_path(rich_root, digest).write_bytes(png + b"x")
        refused = c.get(f"/api/run/rich/media/{digest}")
        assert refused.status_code == 404 and "has changed" in refused.json()["error"]


def test_the_console_is_shown_in_order_and_searched(rich_root):
    with client(rich_root, "127.0.0.1") as c:
        got = c.get("/api/run/rich/console").json()
        assert [(x["stream"], x["line_no"], x["text"]) for x in got["lines"]] == [
            ("stdout", 0, "epoch 0"), ("stdout", 1, "loss 2.5"), ("stderr", 0, "Warning: slow"), ("stdout", 7, "epoch 1")]
        assert got["dropped"] == 5
        found = c.get("/api/run/rich/console?q=EPOCH").json()
        assert [x["text"] for x in found["lines"]] == ["epoch 0", "epoch 1"] and found["found"] == 2
