"""Attacks on attested model checkpoints, seen by `runledger verify` and `runledger tlog audit`: both check every
stored `attestation` event as `runledger attest verify` checks its folder. The promise: a root whose
verify and audit pass holds no attestation whose checkpoint folder, at hand, is not the one the worker
signed and recorded. The attacker edits a file of an attested folder, or swaps its statement: each is
named in one line by both, which exit 1; a root without attestations says nothing of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runledger.ledger import attest
from runledger.ledger.contract.canonical import canonical_json
from runledger.ledger.contract.events import subject_for
from runledger.ledger.emit.sealing import seal
from runledger.ledger.ingest import service
from runledger.tools.cli import main
from support.attesting import attest_folder, flip_a_byte, model_folder
from support.batches import batch_for
from support.tlogs import tlog_audit, verify_root

pytest.importorskip("model_signing", reason="the [attest] extra")

RUN = "r1"


def _store(root: Path, msgs) -> None:
    ledger = service.Ledger(root)
    ledger.write(ledger.decode(msgs))
    ledger.commit()
    ledger.tlog.sign()


def _store_attestation(root: Path, folder: Path, sseq: int = 1) -> str:
    """Attest `folder` (a checkpoint at hand) and store its event in `root`'s run; the event's id."""
    event = attest_folder(folder, run_id=RUN)
    env, _ = seal(RUN, "worker-0", 0, 0, "attestation", event.model_dump(), 4, "")
    _store(root, [(subject_for(RUN, "attestation"), canonical_json(env).encode(), sseq)])
    return env["event_id"]


@pytest.fixture
def stored_attestation(root, tmp_path):
    """A root with a signed log whose run holds the attestation of a checkpoint folder at hand: (root, folder,
    the event's id)."""
    folder = model_folder(tmp_path / "ckpt" / "step_00000004")
    return root, folder, _store_attestation(root, folder)



def test_an_edited_checkpoint_file_is_named_by_verify_and_the_audit(stored_attestation, capsys):
    root, folder, event_id = stored_attestation
    flip_a_byte(folder / "state" / "d" / "0.data")
    rc, out = verify_root(root, capsys)
    problems = [line for line in out.splitlines() if line.startswith("  - ")]
    assert rc == 1 and len(problems) == 1, out
    assert f"attestation {event_id}: model signing refuses" in problems[0] and "state/d/0.data" in problems[0], out
    rc, out = tlog_audit(root, capsys)
    assert rc == 1 and f"attestation {event_id}: model signing refuses" in out and out.count("\n") == 1, out


def test_a_swapped_statement_is_named_by_verify_and_the_audit(stored_attestation, capsys):
    root, folder, event_id = stored_attestation
    st = json.loads((folder / attest.STATEMENT).read_bytes())
    st["predicate"]["buildDefinition"]["externalParameters"]["config"]["seed"] = 1  # another config, same subject
    (folder / attest.STATEMENT).write_bytes(attest.statement_bytes(st))
    rc, out = verify_root(root, capsys)
    assert rc == 1 and f"attestation {event_id}: " in out and "is not the one the event fixes" in out, out
    rc, out = tlog_audit(root, capsys)
    assert rc == 1 and f"attestation {event_id}: " in out, out


def test_a_checkpoint_signed_by_another_key_than_given_is_named(stored_attestation, capsys, tmp_path):
    root, _, event_id = stored_attestation
    other = attest.load_or_make_key(tmp_path / "other" / "attest.key")
    rc, out = verify_root(root, capsys, "--attest-key", str(attest.public_file(other)))
    assert rc == 1 and f"attestation {event_id}: signed with key" in out and "not a key given" in out, out


def test_an_attestation_without_its_folder_or_key_is_said_not_failed(stored_attestation, capsys, tmp_path):
    root, folder, _ = stored_attestation
    attest.public_file(attest.key_file()).rename(tmp_path / "elsewhere.pub")  # an auditor without the signer's key
    rc, out = verify_root(root, capsys)
    assert rc == 0 and "attestations: 0 checked, 1 unchecked (no public key of the signer at hand" in out, out
    folder.rename(tmp_path / "moved")  # the checkpoint deleted (or on the producer's machine only)
    rc, out = verify_root(root, capsys, "--attest-key", str(tmp_path / "elsewhere.pub"))
    assert rc == 0 and "attestations: 0 checked, 1 not at hand (the folder absent" in out, out


def test_a_root_says_nothing_of_attestations_until_it_holds_one(root, capsys, tmp_path):
    _store(root, batch_for(["r0"], 5))
    for rc, out in (verify_root(root, capsys), tlog_audit(root, capsys)):
        assert rc == 0 and "attestation" not in out, out
    _store_attestation(root, model_folder(tmp_path / "ckpt" / "step_00000004"), sseq=6)
    for rc, out in (verify_root(root, capsys), tlog_audit(root, capsys)):
        assert rc == 0 and "\nattestations: 1 checked\n" in out, out


def test_an_exports_attestations_are_checked_as_a_roots(stored_attestation, capsys, tmp_path):
    root, folder, event_id = stored_attestation
    out_dir = tmp_path / "export"
    assert main(["export", "--all", "--root", str(root), "--out", str(out_dir)]) == 0
    rc, out = verify_root(out_dir, capsys)
    assert rc == 0 and "\nattestations: 1 checked\n" in out, out
    flip_a_byte(folder / "state" / "d" / "0.data")
    rc, out = verify_root(out_dir, capsys)
    assert rc == 1 and f"attestation {event_id}: model signing refuses" in out, out
