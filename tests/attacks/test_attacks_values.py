"""Attacks on the values `log` stores beside numbers (issue 40). The promises: a `media` event names a blob only by its
SHA-256, so no event can point `verify`, the dashboard or a reader at a file outside `{root}/media/` (a hostile one,
sealed with a good hash, is quarantined, and the rest of its batch stored); a blob swapped for a link is named by
`verify`; inside the training loop a bad value costs only itself, with one warning: an oversized table is cut to the
bound (the event still fits), a histogram with NaN edges is skipped, and nothing else the call logged is lost; a
console flood is bounded (memory and lines sent), every line left out counted in its place."""

from __future__ import annotations

import os
import time

import numpy as np

import runledger
from runledger.ledger.check.verify import verify
from runledger.ledger.contract.canonical import canonical_json
from runledger.ledger.contract.events import MAX_EVENT_BYTES, subject_for
from runledger.ledger.emit.sealing import seal
from runledger.ledger.emit.sink import ParquetSink
from runledger.ledger.ingest import service
from runledger.ledger.storage.media import blob_path, store_bytes
from support.reading import reader, stored_ids
from support.runs import listed_run, resealed

T0 = "2026-11-29T10:00:00.000000Z"
RUN, PRODUCER = "run-1", "worker-0"


def test_a_media_event_naming_a_path_instead_of_a_digest_is_quarantined_and_costs_only_itself(root):
    digest, size = store_bytes(root, b"\x89PNG\r\n\x1a\nfine")
    good = {"key": "img", "sha256": digest, "bytes": size, "type": "image/png"}
    first, _ = seal(RUN, PRODUCER, 0, 0, "media", good, 0, "", time=T0)
    second, _ = seal(RUN, PRODUCER, 0, 1, "media", good, 1, first["hash"], time=T0)
    hostile = [resealed({**second, "payload": {**good, "sha256": name}}) for name in
               ("../../../../etc/passwd", "/etc/passwd", digest.upper(), digest + "/..", "a" * 63 + "/")]
    ledger = service.Ledger(root)
    batch = b"[" + b",".join(canonical_json(e).encode() for e in [first, *hostile, second]) + b"]"
    ledger.write(ledger.decode([(subject_for(RUN, "media"), batch, 1)]))
    ledger.commit()
    assert stored_ids(root) == sorted([first["event_id"], second["event_id"]])
    reasons = [r for (r,) in reader(root).execute("select reason from quarantine").fetchall()]
    assert len(reasons) == len(hostile) and all("sha256" in r for r in reasons), reasons
    assert verify(root).ok


def test_a_blob_swapped_for_a_link_out_of_the_root_is_named_by_verify(root, tmp_path):
    secret = tmp_path / "elsewhere.png"
    secret.write_bytes(b"\x89PNG\r\n\x1a\nsame bytes")
    digest, size = store_bytes(root, secret.read_bytes())
    sink = ParquetSink(root, RUN, PRODUCER, 0)
    sink.emit_dict("media", {"key": "img", "sha256": digest, "bytes": size, "type": "image/png"}, 0)
    sink.close()
    assert verify(root).ok
    blob = blob_path(root, digest)
    blob.unlink()
    os.symlink(secret, blob)  # the same bytes, read through a link: not a blob the root holds
    problems = verify(root).problems
    assert [p for p in problems if str(blob) in p and "not a plain file" in p], problems


def test_an_oversized_table_is_cut_to_the_bound_with_one_warning_and_nothing_else_lost(tmp_path, warnings_said):
    run, sink = listed_run(tmp_path, "attacked")
    huge = [[i, "x" * 10_000] for i in range(2_000)]  # 20 MB of text
    one_cell = [["y" * (4 << 20)]]  # one cell past the bound on its own
    for step in range(3):
        run.log({"loss": float(step), "t": runledger.Table(columns=["i", "text"], data=huge),
                 "one": runledger.Table(columns=["c"], data=one_cell), "h": [1.0, 2.0]})
    assert [p["metrics"]["loss"] for _, p in sink.payloads("metrics")] == [0.0, 1.0, 2.0]
    assert len(sink.payloads("histogram")) == 3
    tables = sink.payloads("table")
    assert len(tables) == 6 and all(len(canonical_json(p)) < MAX_EVENT_BYTES for _, p in tables)
    assert {(p["key"], p["rows_logged"], len(p["rows"]) > 0) for _, p in tables} == {("t", 2000, True), ("one", 1, False)}
    assert run.summary["_tables_cut"] == 6
    assert [m.split(":")[0] for m in warnings_said()] == ["a Table past the bound"]


def test_a_histogram_with_nan_edges_costs_only_itself_with_one_warning(tmp_path, warnings_said):
    run, sink = listed_run(tmp_path, "attacked")
    for step in range(4):
        run.log({"loss": 1.0, "bad": runledger.Histogram(np_histogram=([1, 2], [0.0, np.nan, 1.0])),
                 "inf": runledger.Histogram(np_histogram=([1], [-np.inf, 0.0])), "good": np.arange(5.0)})
    assert len(sink.payloads("metrics")) == 4 and [p["key"] for _, p in sink.payloads("histogram")] == ["good"] * 4
    assert run.summary["_skipped_values"] == 8
    assert len(warnings_said()) == 1  # one kind of bad value, said once


def test_a_console_flood_costs_a_counter_not_memory_nor_the_values_logged_beside_it(tmp_path, capsys):
    from runledger import console

    run, sink = listed_run(tmp_path, "attacked")
    run._console = console.Console(run).start()
    total = 200_000
    started = time.monotonic()
    try:
        for step in range(4):
            for i in range(total // 4):
                print(f"flood {step} {i} " + "z" * 50)
            run.log({"loss": float(step), "h": [1.0, 2.0]})
            waiting = sum(s.kept for s in run._console.streams.values())
            assert waiting <= console.BURST  # what waits for a flush is bounded, whatever is printed
    finally:
        elapsed = time.monotonic() - started
        run._console.stop()
    capsys.readouterr()
    assert [p["metrics"]["loss"] for _, p in sink.payloads("metrics")] == [0.0, 1.0, 2.0, 3.0]
    assert len(sink.payloads("histogram")) == 4
    printed = [p for _, p in sink.payloads("console") if p["stream"] == "stdout"]
    kept, dropped = sum(len(p["lines"]) for p in printed), sum(p.get("dropped", 0) for p in printed)
    assert kept + dropped == total and dropped > 0  # every line kept or counted where it was left out
    assert kept <= console.BURST + console.RATE * elapsed + 1  # the rate bound, as it was printed
    numbers = [p["first"] + i for p in printed for i in range(len(p["lines"]))]
    assert numbers == sorted(set(numbers)) and max(numbers) < total
