"""Attacks on attested model checkpoints. The promise: a checkpoint folder whose attestation checks is the
folder the worker signed, described by the statement whose digest the worker recorded in the ledger. The
attacker edits a file of the folder, adds one, swaps the statement for another (canonical, naming the same
signed digest), or re-signs the edited folder with a key of its own and writes a matching statement: model
signing's own verifier or `runledger attest verify`, or both, refuse each with a one-line reason."""

from __future__ import annotations

import json
import shutil

import pytest

from runledger.ledger import attest
from runledger.ledger.emit.sink import ParquetSink
from runledger.tools.cli import main as runledger_main
from support.attesting import attest_folder, flip_a_byte, model_folder

pytest.importorskip("model_signing", reason="the [attest] extra")


@pytest.fixture
def attested(tmp_path, user_data):
    """A folder attested by the worker's key, its `attestation` event stored in a root."""
    root = tmp_path / "root"
    folder = model_folder(tmp_path / "ckpt" / "step_00000004")
    event = attest_folder(folder)
    with ParquetSink(root, "r1", "worker-0", 0) as sink:
        sink.emit(event, step=4)
    assert attest.verify(folder, public=attest.public_pem(attest.key_file()), root=root).startswith("ok: ")
    return root, folder


def _attest_verify(root, folder, *more) -> int:
    return runledger_main(["attest", "verify", str(folder), "--root", str(root), *more])


def _model_signing_accepts(folder, public_file) -> bool:
    from model_signing import verifying

    try:
        verifying.Config().use_elliptic_key_verifier(public_key=public_file).verify(folder, folder / attest.SIGNATURE)
    except ValueError:
        return False
    return True


def test_an_edited_checkpoint_file_fails_model_signing_and_the_audit(attested, capsys):
    root, folder = attested
    assert _attest_verify(root, folder) == 0
    flip_a_byte(folder / "state" / "d" / "0.data")
    assert not _model_signing_accepts(folder, attest.public_file(attest.key_file()))
    assert _attest_verify(root, folder) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("FAILED: model signing refuses") and "state/d/0.data" in err and "\n" not in err


def test_a_file_added_to_the_checkpoint_fails_both(attested):
    root, folder = attested
    (folder / "state" / "d" / "1.data").write_bytes(b"extra weights")
    assert not _model_signing_accepts(folder, attest.public_file(attest.key_file()))
    assert _attest_verify(root, folder) == 1


def test_a_swapped_statement_does_not_match_the_ledgers_event(attested, capsys):
    root, folder = attested
    st = json.loads((folder / attest.STATEMENT).read_bytes())
    st["predicate"]["buildDefinition"]["externalParameters"]["config"]["seed"] = 1  # another config, same subject
    (folder / attest.STATEMENT).write_bytes(attest.statement_bytes(st))
    assert _model_signing_accepts(folder, attest.public_file(attest.key_file()))  # (the weights are untouched)
    assert _attest_verify(root, folder) == 1
    err = capsys.readouterr().err
    assert "is in no attestation event of run 'r1'" in err and "attests this folder with another statement" in err


def test_a_statement_moved_from_another_checkpoint_does_not_check(attested, tmp_path):
    root, folder = attested
    other = model_folder(tmp_path / "other" / "step_00000008")
    attest_folder(other)
    shutil.copy(other / attest.STATEMENT, folder / attest.STATEMENT)
    with pytest.raises(attest.AttestFailed, match="not the digest model signing signed"):
        attest.verify(folder, public=attest.public_pem(attest.key_file()), root=root)


def test_an_edited_checkpoint_re_signed_with_the_attackers_key_is_refused(attested, tmp_path, capsys):
    root, folder = attested
    flip_a_byte(folder / "state" / "d" / "0.data")
    mine = tmp_path / "attacker" / "attest.key"
    attest_folder(folder, key=attest.load_or_make_key(mine))  # a new signature and a statement that match the edit
    assert not _model_signing_accepts(folder, attest.public_file(attest.key_file()))  # not the worker's key
    assert _attest_verify(root, folder) == 1
    # even with the attacker's public key the ledger holds no event of its statement
    assert _attest_verify(root, folder, "--public-key", str(attest.public_file(mine))) == 1
    assert "is in no attestation event" in capsys.readouterr().err.strip().splitlines()[-1]
