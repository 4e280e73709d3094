"""The stream position in the Iceberg commit: each commit's snapshot summary carries, per writer, the
highest stream seq it holds and the stream's identity; a restart reads its place from there, and a
new stream is told from the one the tables were fed by (runledger.ledger.storage.streampos)."""

from __future__ import annotations

from runledger.ledger.ingest import service
from runledger.ledger.storage import streampos
from support.batches import batch_for

OLD, NEW = "RUNLEDGER@2026-01-01T00:00:00+00:00", "RUNLEDGER@2026-02-01T00:00:00+00:00"


def _fed(root, msgs, stream=OLD) -> service.Ledger:
    ledger = service.Ledger(root)
    ledger.stream_id = stream
    ledger.write(ledger.decode(msgs))
    ledger.note_taken(max(s for *_, s in msgs))
    ledger.commit()
    return ledger


def test_each_commit_records_the_stream_and_how_far_it_goes(root):
    msgs = batch_for(["run-a", "run-b"], 10)
    ledger = _fed(root, msgs[:5])
    assert streampos.read(ledger.tables) == streampos.CommitPosition(OLD, {"ledger": 5})
    ledger.write(ledger.decode(msgs[5:]))
    ledger.note_taken(20)
    ledger.commit()
    assert streampos.read(ledger.tables) == streampos.CommitPosition(OLD, {"ledger": 20})


def test_a_restart_reads_its_place_from_the_commit_even_without_the_position_file(root):
    msgs = batch_for(["run-a"], 30)
    _fed(root, msgs[:20])
    (root / "ledger.position").unlink()
    again = service.Ledger(root)
    assert again.taken_upto == 20 and again.expected_stream == OLD
    assert not again.decode(msgs[:20]).events and again.counters.skipped == 20
    assert again.index.loaded == set()  # nothing at or below the place is looked up
    assert len(again.decode(msgs[20:]).events) == 10 and again.index.loaded == {"run-a"}  # above it: the dedupe set


def test_compaction_carries_the_position_forward(root):
    from runledger.ledger.storage.compaction import compact_partition

    msgs = batch_for(["run-a"], 30)
    ledger = _fed(root, msgs[:10])
    for lo in (10, 20):
        ledger.write(ledger.decode(msgs[lo:lo + 10]))
        ledger.note_taken(lo + 10)
        ledger.commit()
    assert compact_partition(root / "events" / "kind=step" / "run_id=run-a", min_files=2) is not None
    snap = ledger.tables.table("step")
    snap.refresh()
    assert "runledger.compaction" in snap.current_snapshot().summary.additional_properties
    assert streampos.read(ledger.tables) == streampos.CommitPosition(OLD, {"ledger": 30})


def test_the_latest_stream_wins_and_its_seqs_alone_count():
    summaries = [{"runledger.commit": "3", streampos.STREAM_KEY: OLD, "runledger.stream-seq.ledger": "900"},
                 {"runledger.commit": "5", streampos.STREAM_KEY: NEW, "runledger.stream-seq.ledger": "7"}]
    assert streampos.of_summaries(summaries) == streampos.CommitPosition(NEW, {"ledger": 7})
    # a commit fed by a new stream does not carry the old stream's seqs of other writers forward
    parent = {streampos.STREAM_KEY: OLD, "runledger.stream-seq.k2-p0": "900", "runledger.stream-seq.k2-p1": "800"}
    child = streampos.carried(parent, streampos.commit_props("k2-p0", 4, NEW))
    assert child == {streampos.STREAM_KEY: NEW, "runledger.stream-seq.k2-p0": "4"}
    assert streampos.carried(parent, streampos.commit_props("k2-p1", 801, OLD))["runledger.stream-seq.k2-p0"] == "900"


def test_an_adopted_stream_starts_from_its_first_message_and_stores_nothing_twice(root):
    msgs = batch_for(["run-a"], 30)
    _fed(root, msgs[:20])
    streampos.adopt(root, NEW, OLD, "test")
    again = service.Ledger(root)
    assert again.taken_upto == 0 and again.expected_stream == NEW
    again.stream_id = NEW
    decoded = again.decode(msgs)  # the new stream from seq 1: the spools replayed into it
    assert len(decoded.events) == 10 and again.counters.duplicates == 20
    again.write(decoded)
    again.note_taken(30)
    again.commit()
    assert streampos.read(again.tables) == streampos.CommitPosition(NEW, {"ledger": 30})
    assert service.Ledger(root).taken_upto == 30
