"""`runledger tlog key|checkpoint|prove|consistency` on a root the ledger stored: what they print is
what a client written elsewhere checks (a tlog-proof verified with the verifier key alone)."""

from __future__ import annotations

import base64
import json

import pytest

from runledger.ledger.ingest import service
from runledger.ledger.storage.reads import read_events
from runledger.ledger.tlog import checkpoint, log, merkle, note
from runledger.tools.cli import main
from support.batches import batch_for


@pytest.fixture
def logged_root(root):
    ledger = service.Ledger(root)
    msgs = batch_for(["run-a", "run-b"], 40)
    for i in range(0, 80, 25):
        ledger.write(ledger.decode(msgs[i:i + 25]))
        ledger.commit()
    ledger.tlog.sign()
    return root


def test_keygen_refuses_a_second_key_and_key_prints_the_vkey(tmp_path, capsys):
    key = tmp_path / "keys" / "tlog.key"
    assert main(["tlog", "keygen", "--name", "runs.example/log", "--out", str(key)]) == 0
    vkey = capsys.readouterr().out.strip()
    assert vkey.startswith("runs.example/log+") and key.stat().st_mode & 0o777 == 0o600
    assert main(["tlog", "key", "--key", str(key)]) == 0 and capsys.readouterr().out.strip() == vkey
    assert main(["tlog", "keygen", "--out", str(key)]) == 2


def test_prove_prints_a_tlog_proof_the_vkey_alone_checks(logged_root, capsys, tmp_path):
    vkey = note.read_key(log.key_file()).verifier
    env = read_events(logged_root, columns=["event_id", "run_id", "producer", "attempt", "seq", "hash"]).to_pylist()[33]
    out = tmp_path / "e.tlog-proof"
    assert main(["tlog", "prove", env["event_id"], "--root", str(logged_root), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("c2sp.org/tlog-proof@v1\nindex ")
    cp = checkpoint.TlogProof.parse(text).verify(log.entry_of(env), [vkey])
    assert cp.size == 80
    forged = {**env, "hash": "00" * 32}
    with pytest.raises(merkle.ProofError):
        checkpoint.TlogProof.parse(text).verify(log.entry_of(forged), [vkey])


def test_consistency_between_two_sizes_checks(logged_root, capsys):
    assert main(["tlog", "checkpoint", "--root", str(logged_root)]) == 0
    assert capsys.readouterr().out.split("\n")[1] == "80"
    assert main(["tlog", "consistency", "25", "80", "--root", str(logged_root)]) == 0
    got = json.loads(capsys.readouterr().out)
    b = base64.b64decode
    merkle.verify_consistency(25, 80, b(got["old_root"]), b(got["new_root"]), [b(p) for p in got["proof"]])
    assert main(["tlog", "consistency", "25", "81", "--root", str(logged_root)]) == 2
