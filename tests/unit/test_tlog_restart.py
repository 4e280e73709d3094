"""A ledger's restart with the transparency log on reads only what lies past the log's durable size (the
commits since its last signature, found by the first leaf each commit records in the tables' snapshots)
and the right edge of its tiles, never every stored event; and still, after each crash window, every
event in the tables has its leaf, in commit order, and every leaf its event. Where the commits cannot
say (the log was off or refused meanwhile, a torn tile, expired history), the log is rebuilt from every
stored event as before, and a log that no longer gives its last signed root is refused."""

from __future__ import annotations

import json

import pytest

from runledger.ledger.emit.sealing import seal
from runledger.ledger.contract.events import subject_for
from runledger.ledger.ingest import service
from runledger.ledger.storage import leaves, store
from runledger.ledger.storage.tables import Tables
from runledger.ledger.tlog import audit, note, tiles
from runledger.ledger.tlog import log as tlog
from support.batches import batch_for


def _taken_in(ledger: service.Ledger, msgs) -> None:
    ledger.write(ledger.decode(msgs))
    ledger.note_taken(max(sseq for _, _, sseq in msgs))
    ledger.commit()


def _unsigned(m) -> None:
    """No checkpoint signed after a commit (as within SIGN_EVERY_S of the last one), within `m`."""
    m.setattr(tlog.Log, "maybe_sign", lambda self, envs: None)


def _no_full_read(monkeypatch) -> None:
    def every_event(*args, **kw):
        raise AssertionError("the restart read every stored event")
    monkeypatch.setattr(tlog, "stored_events", every_event)


def _leaf_keys(log_dir, size: int) -> list[str]:
    return ["{run_id}/{producer}/{attempt}/{seq}".format(**json.loads(e))
            for e in tiles.Tiles(log_dir).entries(size)]


def _audited(root, tmp_path) -> int:
    """The audit from public files alone passes; returns the events it matched with leaves."""
    done = audit.audit(str(root / "tlog"), [note.read_key(tlog.key_file()).verifier], root, seen=tmp_path / "seen")
    assert done.events == done.logs[0].size
    return done.events


def _restarted(root) -> service.Ledger:
    store.forget_tables(root)  # (a new process: no cached table handles)
    return service.Ledger(root)


def test_commits_after_the_last_signature_get_their_leaves_in_commit_order_without_reading_every_event(
        root, tmp_path, monkeypatch):
    first = service.Ledger(root)
    _taken_in(first, batch_for(["run-a"], 20))
    first.tlog.sign()
    later = batch_for(["run-b", "run-c", "run-d"], 10, first_sseq=21)
    with monkeypatch.context() as m:
        _unsigned(m)
        for i in range(0, 30, 10):  # three commits, then the process dies before any is signed
            _taken_in(first, later[i:i + 10])
    _no_full_read(monkeypatch)
    again = _restarted(root)
    assert again.tlog.size == 50
    assert _leaf_keys(root / "tlog", 50)[20:] == [f"run-{r}/worker-0/0/{s}" for r in "bcd" for s in range(10)]
    assert _audited(root, tmp_path) == 50


def test_a_clean_restart_appends_nothing_and_reads_no_event(root, tmp_path, monkeypatch):
    first = service.Ledger(root)
    _taken_in(first, batch_for(["run-a"], 20))
    first.compact_idle()  # (signs, as a quiet ledger does)
    _no_full_read(monkeypatch)
    monkeypatch.setattr(leaves, "_keys", lambda files: pytest.fail(f"read {files}"))
    again = _restarted(root)
    assert again.tlog.size == 20
    _taken_in(again, batch_for(["run-b"], 5, first_sseq=21))
    again.tlog.sign()
    assert _audited(root, tmp_path) == 25


def _two_kinds(run: str, n: int, first_sseq: int = 1) -> list[tuple[str, bytes, int]]:
    """n events of one chain alternating `step` and `metrics`: each commit of them touches two tables."""
    out, prev = [], ""
    for s in range(n):
        kind, payload = ("step", {"loss": 1.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 8, "step_time_s": 0.1}) \
            if s % 2 == 0 else ("metrics", {"metrics": {"x": float(s)}})
        env, text = seal(run, "worker-0", 0, s, kind, payload, s, prev)
        prev = env["hash"]
        out.append((subject_for(run, kind), text.encode(), first_sseq + s))
    return out


def test_a_commit_cut_short_between_its_tables_still_gives_the_committed_events_their_leaves(
        root, tmp_path, monkeypatch):
    msgs = _two_kinds("run-a", 20)
    first = service.Ledger(root)
    first.stream_id = "RUNLEDGER@test"  # (bound to a stream: its place is read from the commit)
    _taken_in(first, msgs[:10])
    first.tlog.sign()
    append, calls = Tables._append, []

    def dies_after_one_table(self, *args, **kw):
        if calls:
            raise SystemExit("killed between the tables of one commit")
        calls.append(1)
        return append(self, *args, **kw)

    with monkeypatch.context() as m, pytest.raises(SystemExit):
        m.setattr(Tables, "_append", dies_after_one_table)
        _taken_in(first, msgs[10:])
    _no_full_read(monkeypatch)
    again = _restarted(root)
    again.stream_id = first.stream_id
    assert again.tlog.size == 15  # the 5 events of the table that took its files
    _taken_in(again, msgs[10:])  # redelivered: the 5 stored are duplicates, the other 5 stored now
    again.tlog.sign()
    assert again.tlog.size == 20 and _audited(root, tmp_path) == 20


def test_events_stored_with_the_log_off_get_their_leaves_when_it_is_on_again(root, tmp_path, monkeypatch):
    _taken_in(service.Ledger(root), batch_for(["run-a"], 10))
    monkeypatch.setenv(tlog.OFF_ENV, "off")
    off = _restarted(root)
    assert off.tlog is None
    _taken_in(off, batch_for(["run-b"], 10, first_sseq=11))
    monkeypatch.setenv(tlog.OFF_ENV, "on")
    again = _restarted(root)
    assert again.tlog.size == 20
    _taken_in(again, batch_for(["run-c"], 5, first_sseq=21))
    again.tlog.sign()
    assert _audited(root, tmp_path) == 25
    third = _restarted(root)  # (caught up once: the commits say where the log stands again)
    assert third.tlog.size == 25


def test_a_torn_tile_at_the_edge_is_rebuilt_from_every_entry(root, tmp_path, monkeypatch):
    first = service.Ledger(root)
    _taken_in(first, batch_for(["run-a"], 20))
    first.tlog.sign()
    with monkeypatch.context() as m:
        _unsigned(m)
        _taken_in(first, batch_for(["run-b"], 10, first_sseq=21))
    (root / "tlog/tile/0/000.p/20").write_bytes(bytes(20 * 32))  # the signed size's partial tile: its blocks lost
    again = _restarted(root)
    assert again.tlog.size == 30
    again.tlog.sign()
    assert _audited(root, tmp_path) == 30


def test_a_log_edited_at_its_edge_is_refused_by_the_restarted_ledger(root, caplog):
    first = service.Ledger(root)
    _taken_in(first, batch_for(["run-a"], 20))
    first.tlog.sign()
    bundle, tile = root / "tlog/tile/entries/000.p/20", root / "tlog/tile/0/000.p/20"
    entries = tiles.unpack_entries(bundle.read_bytes())
    entries[19] = entries[19].replace(b'"seq":19', b'"seq":18')  # one leaf rewritten, its tile made to match
    bundle.write_bytes(tiles.pack_entries(entries))
    from runledger.ledger.tlog import merkle
    tile.write_bytes(b"".join(merkle.leaf_hash(e) for e in entries))
    with caplog.at_level("ERROR"):
        again = _restarted(root)
    assert again.tlog is None
    assert any("the transparency log is not extended" in r.message and "last signed checkpoint" in r.message
               for r in caplog.records)


def test_expired_history_falls_back_to_every_stored_event(root, tmp_path, monkeypatch):
    first = service.Ledger(root)
    _taken_in(first, batch_for(["run-a"], 10))
    first.tlog.sign()
    later = batch_for(["run-b"], 30, first_sseq=11)
    with monkeypatch.context() as m:
        _unsigned(m)
        for i in range(0, 30, 10):
            _taken_in(first, later[i:i + 10])
    first.tables._expire(first.tables.table("step"), 1)  # only the newest snapshot kept
    again = _restarted(root)
    assert again.tlog.size == 40
    assert _leaf_keys(root / "tlog", 40)[10:] == [f"run-b/worker-0/0/{s}" for s in range(30)]
    again.tlog.sign()
    assert _audited(root, tmp_path) == 40


def test_a_root_moved_after_a_crash_still_gives_every_event_its_leaf(root, tmp_path, monkeypatch):
    first = service.Ledger(root)
    _taken_in(first, batch_for(["run-a"], 10))
    first.tlog.sign()
    with monkeypatch.context() as m:
        _unsigned(m)
        _taken_in(first, batch_for(["run-b"], 10, first_sseq=11))  # then the process dies, unsigned
    store.forget_tables(root)
    moved = root.rename(tmp_path / "moved")  # (its tables are registered anew there: their history is gone)
    again = _restarted(moved)
    assert again.tlog.size == 20
    again.tlog.sign()
    assert _audited(moved, tmp_path) == 20


def test_a_partitions_restart_finds_its_own_commits_among_another_partitions(root, tmp_path, monkeypatch):
    from runledger.ledger.ingest.partitions import Part, partition_of

    k = 2
    runs = [f"run-{i}" for i in range(20)]
    mine, theirs = ([r for r in runs if partition_of(r, k) == p][:2] for p in (0, 1))
    a, b = service.Ledger(root, position=Part(k, 0)), service.Ledger(root, position=Part(k, 1))
    _taken_in(a, batch_for(mine[:1], 10))
    a.tlog.sign()
    with monkeypatch.context() as m:
        _unsigned(m)
        _taken_in(a, batch_for(mine[1:], 10, first_sseq=11))  # partition 0 dies unsigned...
        _taken_in(b, batch_for(theirs, 10, first_sseq=21))  # ...while partition 1 commits to the same table
    _no_full_read(monkeypatch)
    again = service.Ledger(root, position=Part(k, 0))
    assert again.tlog.size == 20
    assert _leaf_keys(root / "tlog" / "p0", 20) == [f"{r}/worker-0/0/{s}" for r in mine for s in range(10)]
