"""The log in the ledger's commit path: after a crash between the tables' commit and the log's append,
the restarted ledger gives every stored event its leaf and the audit passes; a partition's log is its
own origin, and a second ledger taking the partition over extends it (consistent checkpoints)."""

from __future__ import annotations

from pathlib import Path

from runledger.ledger.ingest import service
from runledger.ledger.ingest.partitions import Part, partition_of
from runledger.ledger.tlog import audit, checkpoint, merkle, note, tiles
from runledger.ledger.tlog import log as tlog
from support.batches import batch_for


def _vkey() -> note.Verifier:
    return note.read_key(tlog.key_file()).verifier


def _commit(ledger: service.Ledger, msgs) -> None:
    ledger.write(ledger.decode(msgs))
    ledger.commit()


def test_a_crash_between_the_tables_and_the_log_is_recovered(root, tmp_path, monkeypatch):
    msgs = batch_for(["run-a", "run-b"], 30)
    first = service.Ledger(root)
    _commit(first, msgs[:20])
    first.tlog.sign()
    monkeypatch.setattr(first.tlog, "append", lambda envs: (_ for _ in ()).throw(SystemExit("killed")))
    try:  # the process dies after the tables took the next batch, before its leaves were written
        _commit(first, msgs[20:45])
    except SystemExit:
        pass
    again = service.Ledger(root)  # restarted: the log catches up with the tables
    assert again.tlog.size == 45
    _commit(again, msgs[45:])
    again.tlog.sign()
    done = audit.audit(str(root / "tlog"), [_vkey()], root, seen=tmp_path / "seen")
    assert done.events == done.logs[0].size == 60
    signed = checkpoint.open_signed((root / "tlog/checkpoint").read_text(), [_vkey()])
    rebuilt = [merkle.leaf_hash(e) for e in tiles.Tiles(root / "tlog").entries(signed.size)]
    assert merkle.root_of(rebuilt) == signed.root


def test_a_partition_taken_over_extends_its_own_log(root, tmp_path):
    k = 2
    runs = [r for r in (f"run-{i}" for i in range(20)) if partition_of(r, k) == 0][:2]
    msgs = batch_for(runs, 20)
    a = service.Ledger(root, position=Part(k, 0))
    _commit(a, msgs[:15])
    a.tlog.sign()
    before = checkpoint.open_signed((root / "tlog/p0/checkpoint").read_text(), [_vkey()])
    assert before.origin == _vkey().name + "/p0" and before.size == 15
    b = service.Ledger(root, position=Part(k, 0))  # another host takes partition 0 over
    _commit(b, msgs[15:])
    b.tlog.sign()
    after = checkpoint.open_signed((root / "tlog/p0/checkpoint").read_text(), [_vkey()])
    assert (after.origin, after.size) == (before.origin, 40)
    node = tiles.Tiles(root / "tlog/p0").node(after.size)
    merkle.verify_consistency(before.size, after.size, before.root, after.root,
                              merkle.consistency_proof(node, before.size, after.size))
    assert not Path(root / "tlog/checkpoint").exists()  # one log per partition, under tlog/p{N}/
    done = audit.audit(str(root / "tlog"), [_vkey()], root, seen=tmp_path / "seen")
    assert [cp.origin for cp in done.logs] == [before.origin] and done.events == 40


def test_the_demos_log_step_prints_the_checkpoint_and_its_audit_names_an_edit(root, tmp_path, monkeypatch, capsys):
    """tools/demo.py's last step on a small root: the checkpoint and a passing audit; then the same audit
    on an edited copy of what was published fails naming the edit."""
    from rich.console import Console

    from runledger.tools.demo import audit_log, demo_key

    monkeypatch.setenv(tlog.KEY_ENV, "")  # (none given; restored after the test: demo_key sets it)
    monkeypatch.setattr("runledger.ledger.settings.demo_dir", lambda: tmp_path / "demos")
    demo_key(root)
    _commit(service.Ledger(root), batch_for(["main"], 12))
    assert audit_log(root, Console(width=200))
    out = capsys.readouterr().out
    assert f"runledger.local/{root.name}\n12\n" in out and "tlog audit: ok: 12 events" in out
    bundle = root / "tlog/tile/entries/000.p/12"
    bundle.write_bytes(bundle.read_bytes().replace(b'"seq":5', b'"seq":6', 1))
    try:
        audit.audit(str(root / "tlog"), [_vkey()], root, seen=tmp_path / "seen")
    except audit.AuditFailed as err:
        assert "entry bundles do not give the checkpoint's root" in str(err)
    else:
        raise AssertionError("the edit passed")


def test_a_second_root_signing_with_the_same_key_is_warned_about(tmp_path, caplog):
    service.Ledger(tmp_path / "one")
    with caplog.at_level("WARNING"):
        service.Ledger(tmp_path / "one")  # the same root again: its own log
    assert "already signs the log of root" not in caplog.text
    with caplog.at_level("WARNING"):
        service.Ledger(tmp_path / "two")
    assert "already signs the log of root" in caplog.text and str(tmp_path / "one") in caplog.text


def test_a_root_moved_to_another_key_still_stores_and_its_log_catches_up_with_the_right_key(root, tmp_path,
                                                                                           monkeypatch, caplog):
    """A root copied to a machine (or user) whose key is another: the log refuses that key, the ledger
    says so and goes on storing every event; given the log's own key, it gives them their leaves."""
    msgs = batch_for(["run-a"], 30)
    first = service.Ledger(root)
    _commit(first, msgs[:10])
    first.tlog.sign()
    own = tlog.key_file()
    monkeypatch.setenv(tlog.KEY_ENV, str(tmp_path / "other" / "tlog.key"))  # a key of another origin
    with caplog.at_level("ERROR"):
        moved = service.Ledger(root)
    assert moved.tlog is None
    assert any("the transparency log is not extended" in r.message and "origin" in r.message for r in caplog.records)
    _commit(moved, msgs[10:])
    monkeypatch.setenv(tlog.KEY_ENV, str(own))
    back = service.Ledger(root)
    assert back.tlog.size == 30  # every stored event has its leaf
    back.tlog.sign()
    done = audit.audit(str(root / "tlog"), [_vkey()], root, seen=tmp_path / "seen")
    assert done.events == done.logs[0].size == 30


def test_a_signature_that_fails_after_the_leaves_are_in_does_not_log_them_twice(root, tmp_path, monkeypatch):
    """A full disk while signing (the chaos suite's disk-full phase): the leaves appended stay appended once,
    and the next commit and signature go on from them."""
    msgs = batch_for(["run-a"], 30)
    ledger = service.Ledger(root)
    _commit(ledger, msgs[:10])
    sign = ledger.tlog.maybe_sign
    monkeypatch.setattr(ledger.tlog, "maybe_sign", lambda envs: (_ for _ in ()).throw(OSError(28, "No space left")))
    _commit(ledger, msgs[10:20])
    monkeypatch.setattr(ledger.tlog, "maybe_sign", sign)
    _commit(ledger, msgs[20:])
    ledger.tlog.sign()
    assert ledger.tlog.size == 30
    done = audit.audit(str(root / "tlog"), [_vkey()], root, seen=tmp_path / "seen")
    assert done.events == done.logs[0].size == 30
