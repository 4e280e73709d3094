"""Attacks on the transparency log, each caught by `runledger tlog audit` from public files alone.
The promise: one append-only record; whoever holds the root (and even the log's key) cannot rewrite
it, cut it short, or let the tables and the log disagree without an auditor who checked it once
before, or who reads the tables beside it, naming what was done."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runledger.ledger.ingest import service
from runledger.ledger.storage import paths
from runledger.ledger.storage.tables import Tables
from runledger.ledger.tlog import log as tlog
from runledger.ledger.tlog import note
from runledger.tools.cli import main
from support.batches import batch_for
from support.tlogs import tlog_audit


def _store_in_batches(root: Path, msgs, batches: int = 3) -> service.Ledger:
    ledger = service.Ledger(root)
    size = -(-len(msgs) // batches)
    for i in range(0, len(msgs), size):
        ledger.write(ledger.decode(msgs[i:i + size]))
        ledger.commit()
    ledger.tlog.sign()
    return ledger


def test_the_audit_of_an_untouched_root_passes_and_names_size_and_root(root, capsys):
    _store_in_batches(root, batch_for(["run-1", "run-2"], 30))
    rc, out = tlog_audit(root, capsys)
    assert rc == 0, out
    assert "size 60, root " in out and "ok: 60 events" in out


def _rewritten(root: Path) -> Path:
    """Where the rewritten root is published in the original's place (a new folder: this process's
    Iceberg caches remember the old one's files)."""
    forged = root.parent / "rewritten"
    forged.mkdir()
    return forged


def test_a_consistent_rewrite_resigned_with_the_same_key_is_caught(root, capsys):
    _store_in_batches(root, batch_for(["run-1", "run-2"], 30))
    assert tlog_audit(root, capsys)[0] == 0  # the auditor saw the log once
    forged = _rewritten(root)  # whoever holds the root (and the key) rewrites it all: events, heads, digests, log
    _store_in_batches(forged, batch_for(["run-1", "run-2"], 30, loss=0.5))
    assert main(["verify", "--root", str(forged)]) == 0  # the rewritten root agrees with itself
    rc, out = tlog_audit(forged, capsys)
    assert rc == 1 and "the log was rewritten" in out and "size 60" in out, out


def test_a_longer_rewrite_is_caught_too(root, capsys):
    _store_in_batches(root, batch_for(["run-1"], 20))
    assert tlog_audit(root, capsys)[0] == 0
    forged = _rewritten(root)
    _store_in_batches(forged, batch_for(["run-1"], 40, loss=0.25))
    rc, out = tlog_audit(forged, capsys)
    assert rc == 1 and "not consistent with size 20" in out, out


def test_an_event_deleted_from_the_tables_with_its_leaf_left_is_caught(root, capsys):
    _store_in_batches(root, batch_for(["run-1"], 30))
    last = paths.event_files(root, "step", "run-1")[-1]
    Tables(root).replace("step", [last], [])  # a commit that drops the chain's last file
    rc, out = tlog_audit(root, capsys)
    assert rc == 1 and "which" in out and "does not hold" in out and "run-1/worker-0/0/20" in out, out


def test_a_leaf_without_its_event_is_caught(root, capsys):
    ledger = _store_in_batches(root, batch_for(["run-1"], 10))
    ledger.tlog.append([{"attempt": 0, "hash": "ab" * 32, "producer": "worker-0", "run_id": "run-9", "seq": 0}])
    ledger.tlog.sign()  # the log's holder logs an event the tables never held
    rc, out = tlog_audit(root, capsys)
    assert rc == 1 and "leaf 10 logs event run-9/worker-0/0/0" in out, out


def test_an_event_stored_behind_the_log_is_caught(root, capsys, monkeypatch):
    _store_in_batches(root, batch_for(["run-1"], 10))
    monkeypatch.setenv("RUNLEDGER_TLOG", "off")  # a ledger that stores without logging
    _store_more = service.Ledger(root)
    _store_more.write(_store_more.decode(batch_for(["run-2"], 5, first_sseq=11)))  # (past the stream seqs stored)
    _store_more.commit()
    rc, out = tlog_audit(root, capsys)
    assert rc == 1 and "run-2/worker-0/0/0" in out and "leaf of no signed checkpoint" in out, out


def test_a_log_truncated_to_an_earlier_size_is_caught(root, capsys):
    _store_in_batches(root, batch_for(["run-1"], 30))
    assert tlog_audit(root, capsys)[0] == 0
    entries = list(tlog.tiles.Tiles(root / "tlog").entries(30))
    shutil.rmtree(root / "tlog")  # the log cut back to 20 leaves and signed again with the log's key
    shutil.rmtree(root / "tlog-state")
    cut = tlog.Log(root, signer=note.read_key(tlog.key_file()))
    cut.open([])
    cut.append_entries(entries[:20])
    cut.sign()
    rc, out = tlog_audit(root, capsys)
    assert rc == 1 and "truncated" in out and "size 20" in out and "size 30" in out, out


@pytest.mark.parametrize("edit", ["checkpoint", "bundle", "tile"])
def test_an_edited_public_file_is_caught(root, capsys, edit):
    _store_in_batches(root, batch_for(["run-1"], 10))
    d = root / "tlog"
    if edit == "checkpoint":
        cp = d / "checkpoint"
        cp.write_text(cp.read_text().replace("\n10\n", "\n9\n"))
        want = "the checkpoint does not check"
    elif edit == "bundle":
        b = d / "tile/entries/000.p/10"
        b.write_bytes(b.read_bytes().replace(b'"seq":3', b'"seq":4'))
        want = "entry bundles do not give"
    else:
        t = d / "tile/0/000.p/10"
        t.write_bytes(bytes(32) + t.read_bytes()[32:])
        want = "tiles do not give"
    rc, out = tlog_audit(root, capsys)
    assert rc == 1 and want in out, out


def test_the_audit_reads_an_export_and_names_an_event_the_export_left_out(root, tmp_path, capsys):
    _store_in_batches(root, batch_for(["run-1", "run-2"], 15))
    vkey = note.read_key(tlog.key_file()).verifier.text()
    assert main(["export", "--all", "--root", str(root), "--out", str(tmp_path / "all")]) == 0
    assert main(["export", "run-1", "--root", str(root), "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    args = ["tlog", "audit", "--log", str(root / "tlog"), "--vkey", vkey, "--state", str(tmp_path / "seen")]
    assert main(args + ["--events", str(tmp_path / "all")]) == 0, capsys.readouterr().out
    assert "ok: 30 events" in capsys.readouterr().out
    assert main(args + ["--events", str(tmp_path / "one")]) == 1  # a leaf whose event the export lacks
    assert "run-2/worker-0/0/0" in capsys.readouterr().out
