"""The values `log` stores beside numbers (`runledger.values`): a Histogram's buckets exactly (from values, from
np_histogram, from Levanter's SummaryStats), a bare list or array given to `log` as one; a Table's rows as given,
cut past the bound with one warning and counted; an Image's PNG bytes (decoded by PIL back to the array) and a
file's bytes kept by SHA-256 under the root before the event; a bad value skipped with one warning, counted,
and nothing else the call logged lost. Each event is checked against the contract by the list sink."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pytest

import runledger
from runledger import values
from runledger.ledger.contract import events
from runledger.ledger.contract.validation import check_payload
from runledger.ledger.storage import media
from support.runs import listed_run


def test_the_bounds_are_the_contracts():
    assert (values.MAX_BUCKETS, values.MAX_TABLE_COLUMNS, values.MAX_TABLE_ROWS, values.MAX_TABLE_BYTES, values.MAX_NAME) == (
        events.MAX_BUCKETS, events.MAX_TABLE_COLUMNS, events.MAX_TABLE_ROWS, events.MAX_TABLE_BYTES, events.MAX_METRIC_NAME)
    assert media.MEDIA_DIR == events.MEDIA_DIR


def test_a_histogram_of_values_keeps_every_bucket_and_the_summary_stats():
    rng = np.random.default_rng(0)
    x = rng.normal(size=1000)
    got = runledger.Histogram(np.append(x, [np.nan, np.inf]), num_bins=100).payload()
    counts, edges = np.histogram(x, bins=100)
    assert got["counts"] == counts.tolist() and got["edges"] == edges.tolist()
    assert (got["count"], got["nonfinite"]) == (1000, 2)
    assert got["min"] == x.min() and got["max"] == x.max() and got["sum"] == x.sum() and got["sum_squares"] == (x * x).sum()
    check_payload("histogram", {"key": "h", **got})


def test_np_histogram_and_levanters_summary_stats_are_kept_as_given():
    got = runledger.Histogram(np_histogram=([3, 0, 2], [0.0, 0.5, 1.5, 4.0])).payload()
    assert got == {"edges": [0, 0.5, 1.5, 4], "counts": [3, 0, 2], "count": 5}  # (no values: no min, max, sums)

    class SummaryStats:  # levanter.tracker.histogram.Histogram's fields
        min, max, num, sum, sum_squares = np.float32(-1.0), np.float32(2.0), np.int32(7), np.float32(3.5), np.float32(9.25)
        bucket_limits, bucket_counts = np.array([-1.0, 0.0, 1.0, 2.0]), np.array([2, 4, 1])

    got = values.value_of(SummaryStats()).payload()
    assert got == {"edges": [-1, 0, 1, 2], "counts": [2, 4, 1], "count": 7, "min": -1.0, "max": 2.0, "sum": 3.5,
                   "sum_squares": 9.25}


@pytest.mark.parametrize("bad, why", [
    (runledger.Histogram(np_histogram=([1, 2], [0.0, np.nan, 1.0])), "not all finite"),
    (runledger.Histogram(np_histogram=([1, 2], [0.0, 1.0])), "one more edge"),
    (runledger.Histogram(np_histogram=([1, 2], [2.0, 1.0, 3.0])), "fall"),
    (runledger.Histogram(np_histogram=([1, -2], [0.0, 1.0, 2.0])), "below zero"),
    (runledger.Histogram(["a", "b"]), "not numbers"),
    (runledger.Histogram(np.arange(3), num_bins=values.MAX_BUCKETS + 1), "num_bins"),
    (runledger.Histogram(), "of nothing"),
])
def test_a_histogram_that_cannot_be_stored_says_why(bad, why):
    with pytest.raises(values.Skipped, match=why):
        bad.payload()


def test_the_contract_refuses_buckets_that_do_not_fit(tmp_path):
    with pytest.raises(events.InvalidEvent, match="one more than the counts"):
        check_payload("histogram", {"key": "h", "edges": [0, 1], "counts": [1, 1], "count": 2})
    with pytest.raises(events.InvalidEvent, match="must not fall"):
        check_payload("histogram", {"key": "h", "edges": [1, 0], "counts": [1], "count": 1})
    with pytest.raises(events.InvalidEvent, match="3 cells for 2 columns"):
        check_payload("table", {"key": "t", "columns": ["a", "b"], "rows": [[1, 2, 3]], "rows_logged": 1})
    with pytest.raises(events.InvalidEvent, match="sha256"):
        check_payload("media", {"key": "m", "sha256": "../../etc/passwd", "bytes": 1, "type": "image/png"})


def test_a_table_keeps_its_cells_and_is_cut_past_the_bound():
    t = runledger.Table(columns=["prompt", "score", "ok", "n"], data=[["hi", 0.5, True, None], ["yo", np.float32(2), False, 2**60]])
    assert t.payload() == {"columns": ["prompt", "score", "ok", "n"], "rows_logged": 2,
                           "rows": [["hi", 0.5, True, None], ["yo", 2.0, False, str(2**60)]]}
    assert t.cut is False
    big = runledger.Table(columns=["i", "text"], data=[[i, "x" * 100] for i in range(values.MAX_TABLE_ROWS + 5)])
    got = big.payload()
    assert big.cut and got["rows_logged"] == values.MAX_TABLE_ROWS + 5 and 0 < len(got["rows"]) <= values.MAX_TABLE_ROWS
    assert got["rows"] == [[i, "x" * 100] for i in range(len(got["rows"]))]  # the first rows, as they were
    check_payload("table", {"key": "t", **got})


def test_an_image_array_is_a_png_that_decodes_to_it(tmp_path):
    from PIL import Image as PIL

    rng = np.random.default_rng(1)
    for array in (rng.integers(0, 256, size=(5, 7, 3), dtype=np.uint8), rng.integers(0, 256, size=(4, 3), dtype=np.uint8),
                  rng.integers(0, 256, size=(2, 3, 4), dtype=np.uint8)):
        png = values.png_of(array)
        assert np.array_equal(np.asarray(PIL.open(io.BytesIO(png))), array)
        assert values.png_of(array) == png  # the same array, the same bytes (and blob)
    floats = np.linspace(0, 1, 12).reshape(3, 4)
    assert np.array_equal(np.asarray(PIL.open(io.BytesIO(values.png_of(floats)))), np.rint(floats * 255).astype(np.uint8))
    chw = rng.integers(0, 256, size=(3, 5, 6), dtype=np.uint8)
    assert np.asarray(PIL.open(io.BytesIO(values.png_of(chw)))).shape == (5, 6, 3)
    for bad in (np.zeros((2, 2, 2, 2)), np.zeros((2, 3, 5)), np.array([[np.nan]])):
        with pytest.raises(values.Skipped):
            values.png_of(bad)


def test_log_stores_each_value_as_its_event_with_the_blob_first(tmp_path, warnings_said):
    run, sink = listed_run(tmp_path, "rich")
    pic = np.arange(12, dtype=np.uint8).reshape(3, 4)
    doc = tmp_path / "notes.txt"
    doc.write_bytes(b"hello")
    run.log({"loss": 1.0, "h": runledger.Histogram([1.0, 2.0, 2.0], num_bins=2), "bare": [1, 2, 3], "arr": np.ones((2, 2)),
             "t": runledger.Table(columns=["a"], data=[["x"]]), "img": runledger.Image(pic, caption="c"),
             "doc": runledger.File(doc)})
    assert sink.kinds() == ["histogram", "histogram", "histogram", "table", "media", "media", "metrics"]
    (_, h), (_, bare), (_, arr) = sink.payloads("histogram")
    assert (h["key"], h["counts"], bare["key"], bare["count"], arr["key"], arr["count"]) == ("h", [1, 2], "bare", 3, "arr", 4)
    assert sink.payloads("table") == [(0, {"key": "t", "columns": ["a"], "rows": [["x"]], "rows_logged": 1})]
    (_, img), (_, f) = sink.payloads("media")
    png = values.png_of(pic)
    assert img == {"key": "img", "sha256": hashlib.sha256(png).hexdigest(), "bytes": len(png), "type": "image/png",
                   "caption": "c", "width": 4, "height": 3}
    assert f == {"key": "doc", "sha256": hashlib.sha256(b"hello").hexdigest(), "bytes": 5, "type": "text/plain",
                 "name": "notes.txt"}
    assert media.blob_path(tmp_path, img["sha256"]).read_bytes() == png
    assert media.blob_path(tmp_path, f["sha256"]).read_bytes() == b"hello"
    assert sink.payloads("metrics") == [(0, {"metrics": {"loss": 1.0}})]
    assert not list((tmp_path / "media").glob(".tmp-*")) and warnings_said() == []


def test_a_bad_value_is_skipped_with_one_warning_counted_and_nothing_else_lost(tmp_path, warnings_said):
    run, sink = listed_run(tmp_path, "rich")
    for step in range(3):
        run.log({"loss": float(step), "bad": runledger.Histogram(np_histogram=([1], [np.nan, 1.0])),
                 "gone": runledger.Image(tmp_path / "no-such.png"), "ok": [1.0, 2.0]})
    assert [p["metrics"] for _, p in sink.payloads("metrics")] == [{"loss": 0.0}, {"loss": 1.0}, {"loss": 2.0}]
    assert [p["key"] for _, p in sink.payloads("histogram")] == ["ok"] * 3
    assert run.summary["_skipped_values"] == 6
    said = warnings_said()
    assert len(said) == 2 and any("'bad'" in m and "not all finite" in m for m in said)
    assert any("'gone'" in m and "cannot be read" in m for m in said)


def test_a_table_past_the_bound_is_kept_cut_with_one_warning(tmp_path, warnings_said):
    run, sink = listed_run(tmp_path, "rich")
    rows = [[i] for i in range(values.MAX_TABLE_ROWS + 1)]
    run.log({"t": runledger.Table(columns=["i"], data=rows)})
    run.log({"t": runledger.Table(columns=["i"], data=rows)})
    assert [len(p["rows"]) for _, p in sink.payloads("table")] == [values.MAX_TABLE_ROWS] * 2
    assert run.summary["_tables_cut"] == 2 and len(warnings_said()) == 1


def test_wandbs_audio_video_html_and_object3d_are_files_and_what_cannot_be_stored_is_skipped_once(tmp_path, warnings_said):
    import wave

    run, sink = listed_run(tmp_path, "rich")
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"\x00\x00\x00\x18ftypmp42 not really a video")
    mesh = tmp_path / "mesh.glb"
    mesh.write_bytes(b"glTF\x02\x00\x00\x00 a binary glTF")
    tone = np.sin(np.linspace(0, 40, 800))
    for step in range(2):
        run.log({"tone": runledger.Audio(tone, sample_rate=8000, caption="a tone"), "clip": runledger.Video(str(clip)),
                 "page": runledger.Html("<b>hello</b>"), "mesh": runledger.Object3D(str(mesh)),
                 "frames": runledger.Video(np.zeros((2, 4, 4, 3))), "silent": runledger.Audio(tone)})
    got = {p["key"]: p for _, p in sink.payloads("media")[:4]}
    assert {k: got[k]["type"] for k in got} == {"tone": "audio/wav", "clip": "video/mp4", "page": "text/html",
                                                 "mesh": "model/gltf-binary"}
    with wave.open(str(media.blob_path(tmp_path, got["tone"]["sha256"]))) as w:
        assert (w.getframerate(), w.getnchannels(), w.getnframes()) == (8000, 1, 800)
        assert np.array_equal(np.frombuffer(w.readframes(800), "<i2"), np.rint(tone * 32767).astype("<i2"))
    assert media.blob_path(tmp_path, got["page"]["sha256"]).read_bytes() == b"<b>hello</b>"
    assert len(sink.payloads("media")) == 8 and run.summary["_skipped_values"] == 4  # the frames, the audio without a rate
    said = warnings_said()
    assert len(said) == 2 and any("'frames'" in m for m in said) and any("sample_rate" in m for m in said)
