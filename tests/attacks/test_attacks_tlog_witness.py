"""Witnesses against split views: a ledger whose policy ($RUNLEDGER_TLOG_POLICY) names a witness gets
each checkpoint cosigned by `runledger witness serve` (a child process) and keeps the cosignature in
`tlog/checkpoint`; `runledger tlog audit --policy` requires the quorum. The promise attacked: whoever
holds the log's key cannot show a second history of the same log to someone who checks cosignatures:
the witness refuses to cosign it, so the audit that requires the quorum fails and names the witness."""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from runledger.ledger.ingest import service
from runledger.ledger.tlog import checkpoint, cosignature, note, policy, tiles
from runledger.ledger.tlog import log as tlog
from runledger.tools.cli import main
from support.batches import batch_for
from support.processes import WitnessProcess

STARTS_S = 60  # a witness process starting on a loaded 2-core machine, a round of cosigning


@pytest.fixture
def witnessed(tmp_path, monkeypatch):
    """(witness process, policy file): the ledgers of this test ask the witness, as $RUNLEDGER_TLOG_POLICY says."""
    vkey = tlog.load_or_make_key().verifier.text()
    w = WitnessProcess(tmp_path, vkey).start()
    pol = tmp_path / "policy.txt"
    pol.write_text(f"log {vkey}\nwitness W1 {w.vkey} {w.url}\nquorum W1\n")
    monkeypatch.setenv(policy.POLICY_ENV, str(pol))
    yield w, pol
    w.stop()


def _store_witnessed(root: Path, msgs) -> service.Ledger:
    ledger = service.Ledger(root)
    ledger.write(ledger.decode(msgs))
    ledger.commit()
    _signed(ledger)
    return ledger


def _signed(ledger: service.Ledger) -> str:
    ledger.tlog.sign()
    assert ledger.tlog.witnessing.wait_idle(STARTS_S)
    return (ledger.tlog.dir / tiles.CHECKPOINT).read_text()


def _audit_with_policy(root: Path, pol: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["tlog", "audit", "--log", str(root / "tlog"), "--policy", str(pol), "--events", str(root)])
    return rc, capsys.readouterr().out


def _cosigned_by(signed: str, w: WitnessProcess) -> bool:
    return bool(cosignature.cosigners(signed, [cosignature.CosignVerifier.parse(w.vkey)]))


def test_each_checkpoint_is_cosigned_and_the_audit_requires_it(root, witnessed, capsys):
    w, pol = witnessed
    ledger = _store_witnessed(root, batch_for(["run-1"], 30))
    signed = _signed(ledger)
    assert _cosigned_by(signed, w)
    rc, out = _audit_with_policy(root, pol, capsys)
    assert rc == 0 and "size 30" in out and "cosigned by W1" in out, out
    ledger.write(ledger.decode(batch_for(["run-2"], 25, first_sseq=31)))  # the next checkpoint: from size 30, a proof
    ledger.commit()
    signed = _signed(ledger)
    assert signed.split("\n")[1] == "55" and _cosigned_by(signed, w)
    assert _audit_with_policy(root, pol, capsys)[0] == 0
    event_id = "run-2:worker-0:0:3"
    assert main(["tlog", "prove", event_id, "--root", str(root)]) == 0  # a proof that carries the cosignature
    proof = capsys.readouterr().out
    assert _cosigned_by(checkpoint.TlogProof.parse(proof).signed_checkpoint, w)


def test_a_second_history_of_the_same_size_is_never_cosigned(root, witnessed, capsys):
    w, pol = witnessed
    _store_witnessed(root, batch_for(["run-1", "run-2"], 30))  # the witness saw this log at size 60
    forged_root = root.parent / "rewritten"  # (a new folder: this process's Iceberg caches remember the first)
    forged_root.mkdir()  # the key's holder signs another history of 60 events, to show someone else
    forged = _store_witnessed(forged_root, batch_for(["run-1", "run-2"], 30, loss=0.5))
    signed = _signed(forged)
    assert signed.split("\n")[1] == "60" and not _cosigned_by(signed, w)
    assert "409" in forged.tlog.witnessing.failing["W1"]
    rc, out = _audit_with_policy(forged_root, pol, capsys)
    assert rc == 1 and "lacks the policy's quorum (W1): no valid cosignature from W1" in out, out
    assert _audit_with_policy(root, pol, capsys)[0] == 0  # the history the witness saw still passes


def test_a_witness_down_leaves_the_checkpoint_uncosigned_said_once_and_is_asked_again(root, witnessed, capsys, caplog):
    w, pol = witnessed
    ledger = _store_witnessed(root, batch_for(["run-1"], 10))
    w.stop()
    caplog.set_level(logging.INFO, logger="runledger.ledger.tlog.witnessing")
    for k in range(2):  # two checkpoints while it is down: ingest goes on, one warning
        ledger.write(ledger.decode(batch_for([f"run-{k + 2}"], 5, first_sseq=11 + 5 * k)))
        ledger.commit()
        assert not _cosigned_by(_signed(ledger), w)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "witness W1" in said[0] and "unreachable" in said[0], said
    rc, out = _audit_with_policy(root, pol, capsys)
    assert rc == 1 and "no valid cosignature from W1" in out, out
    w.start()  # back, with the state it had (size 10): the next checkpoint is cosigned from there
    ledger.write(ledger.decode(batch_for(["run-9"], 5, first_sseq=21)))
    ledger.commit()
    assert _cosigned_by(_signed(ledger), w)
    assert any("cosigns" in r.getMessage() and "again" in r.getMessage() for r in caplog.records)
    assert _audit_with_policy(root, pol, capsys)[0] == 0


def test_a_checkpoint_signed_by_a_key_the_witness_does_not_know_gets_403(witnessed):
    w, _ = witnessed
    origin = tlog.load_or_make_key().name
    impostor = note.Signer.generate(origin)  # the log's name, not its key
    cp = checkpoint.Checkpoint(origin, 1, b"\x07" * 32)
    for signer, status in ((impostor, 403), (note.Signer.generate("other.example/log"), 404)):
        body = checkpoint.add_checkpoint_body(0, [], checkpoint.sign(checkpoint.Checkpoint(signer.name, 1, cp.root), signer))
        req = urllib.request.Request(w.url + "add-checkpoint", data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == status
