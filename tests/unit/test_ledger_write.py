"""A write that fails halfway (a full disk, say) is retried from where it stopped: nothing twice."""

from __future__ import annotations

import pytest

from runledger.ledger.bus import consumers
from runledger.ledger.contract.events import subject_for
from runledger.ledger.emit.sealing import seal
from runledger.ledger.ingest import service
from runledger.ledger.storage import paths
from support.batches import batch_for
from support.reading import reader


def test_a_failed_write_is_retried_without_writing_twice(root):
    ledger = service.Ledger(root)
    decoded = ledger.decode(batch_for(["run-a", "run-b"], 50))
    blocker = root / "events" / "kind=step" / "run_id=run-b"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("in the way")  # run-b's partition cannot be created: the write fails halfway
    with pytest.raises(OSError):
        ledger.write(decoded)
        ledger.commit()
    assert decoded.written_groups == {("step", "run-a")}
    blocker.unlink()
    ledger.write(decoded)  # the retry writes run-b only
    ledger.commit()
    con = reader(root)
    assert con.execute("select run_id, count(*) from steps group by 1 order by 1").fetchall() == [("run-a", 50), ("run-b", 50)]
    assert ledger.counters.stored == 100


def test_redelivered_events_are_recognised_after_a_restart(root):
    msgs = batch_for(["run-a"], 30)
    first = service.Ledger(root)
    first.write(first.decode(msgs[:20]))
    first.commit()
    again = service.Ledger(root)  # a new process: its place comes back from what the tables hold
    decoded = again.decode(msgs)  # the first 20 are redelivered (at or below that place), 10 are new
    assert len(decoded.events) == 10 and not decoded.rejected
    again.write(decoded)
    again.commit()
    assert again.counters.skipped == 20 and again.counters.duplicates == 0
    assert reader(root).execute("select count(*), count(distinct event_id) from steps").fetchone() == (30, 30)


def test_events_resent_above_the_position_are_found_stored_by_the_dedupe_set(root):
    msgs = batch_for(["run-a"], 30)
    first = service.Ledger(root)
    first.write(first.decode(msgs[:20]))
    first.note_taken(20)
    first.commit()
    again = service.Ledger(root)
    resent = [(subject, data, sseq + 100) for subject, data, sseq in msgs]  # a producer's spool sent again
    decoded = again.decode(resent)
    assert len(decoded.events) == 10 and not decoded.rejected
    assert again.counters.duplicates == 20 and again.counters.skipped == 0
    assert again.index.loaded == {"run-a"}  # (the dedupe set of that run alone, loaded when needed)


def test_a_conflicting_event_with_a_stored_id_is_quarantined(root):
    msgs = batch_for(["run-a"], 5)
    ledger = service.Ledger(root)
    ledger.write(ledger.decode(msgs))
    ledger.commit()
    env, text = seal("run-a", "worker-0", 0, 2, "step",
                     {"loss": 9.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 8, "step_time_s": 0.1}, 2, "a" * 64)
    decoded = ledger.decode([(subject_for("run-a", "step"), text.encode(), 99)])
    assert not decoded.events
    assert "already stored with a different hash" in decoded.rejected[0].reason


def test_compaction_waits_for_a_quiet_moment_unless_files_pile_up(root, monkeypatch):
    monkeypatch.setattr(service, "COMPACT_BUSY_FILES", 24)
    msgs = batch_for(["run-a"], 60)
    ledger = service.Ledger(root)
    for i in range(20):  # 20 small files: more than a compaction takes, but the ledger is busy
        ledger.write(ledger.decode(msgs[i:i + 1]))
        ledger.commit()
    assert len(paths.event_files(root, "step", "run-a")) == 20 and ledger.counters.compactions == 0
    ledger.compact_idle()  # the fetch came back empty: now
    assert [f.name[:8] for f in paths.event_files(root, "step", "run-a")] == ["compact-"]
    assert ledger.counters.compactions == 1
    for i in range(20, 44):  # busy again: the 24th new file is one too many to wait for
        ledger.write(ledger.decode(msgs[i:i + 1]))
        ledger.commit()
        assert ledger.counters.compactions == (2 if i == 43 else 1)
    assert reader(root).execute("select count(*), count(distinct event_id) from steps").fetchone() == (44, 44)


def test_one_bad_payload_in_a_batch_is_named_and_the_rest_stored(root):
    """A batch's payloads are validated in one call; when one is bad, each is checked alone."""
    prev, texts = "", []
    for s in range(6):
        payload = {"loss": 1.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 8, "step_time_s": 0.1}
        env, text = seal("run-a", "worker-0", 0, s, "step", payload, s, prev)
        prev = env["hash"]
        texts.append(text)
    bad = texts[3].replace('"tokens":8', '"tokens":-8')  # invalid payload (its hash breaks too)
    data = ("[" + ",".join(texts[:3] + [bad] + texts[4:]) + "]").encode()
    ledger = service.Ledger(root)
    decoded = ledger.decode([(subject_for("run-a", "step"), data, 1)])
    assert [e.env["seq"] for e in decoded.events] == [0, 1, 2, 4, 5]
    assert [q.reason for q in decoded.rejected] == ["batch entry 3: payload.tokens: Input should be greater than or equal to 0"]


def test_stream_seq_is_read_from_both_ack_subject_forms():
    from nats.aio.msg import Msg

    for reply in ("$JS.ACK.RUNLEDGER.ledger.1.4567.4500.1764410000000000000.12",
                  "$JS.ACK.hub.ACCHASH.RUNLEDGER.ledger.1.4567.4500.1764410000000000000.12.tok"):
        msg = Msg(_client=None, subject="runledger.r.step", reply=reply)
        assert consumers.stream_seq(msg) == 4567 == msg.metadata.sequence.stream


def test_a_deleted_runs_events_sent_again_are_neither_stored_nor_quarantined(root):
    """`runledger delete`, then the run's messages again (a spool replayed, an old root pushed, a captured
    message resent): the tombstone keeps them out, in the process that stored it and after a restart."""
    from runledger.ledger.storage import removal

    msgs = batch_for(["run-a", "run-b"], 20)
    ledger = service.Ledger(root)
    ledger.write(ledger.decode(msgs))
    ledger.commit()
    payload = removal.tombstone_for(root, "run-a", "alice", "os_user").model_dump(mode="json")
    _, wire = seal("run-a", "cli", 0, 0, "tombstone", payload, None, "")
    ledger.write(ledger.decode([(subject_for("run-a", "tombstone"), wire.encode() if isinstance(wire, str) else wire, 41)]))
    ledger.commit()
    con = reader(root)
    assert con.execute("select run_id, count(*) from steps group by 1").fetchall() == [("run-b", 20)]

    for again in (ledger, service.Ledger(root)):  # (the second: a restarted ledger)
        resent = [(subject, data, sseq + 100) for subject, data, sseq in msgs[:20]]  # run-a's, above the position
        decoded = again.decode(resent)
        assert not decoded.events and not decoded.batches and not decoded.rejected
        again.write(decoded)
        again.commit()
        assert again.counters.deleted == 20
    con = reader(root)
    assert con.execute("select run_id, count(*) from steps group by 1").fetchall() == [("run-b", 20)]
    assert con.execute("select count(*) from quarantine").fetchone()[0] == 0
