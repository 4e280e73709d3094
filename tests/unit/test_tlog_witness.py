"""Witnesses: the C2SP tlog-cosignature v1 format checked against cosignatures another implementation
published, the tlog-policy file and its quorum, and the tlog-witness `add-checkpoint` answers of
`runledger witness serve`'s app, in-process: 200 and a cosignature that checks, 409 with the size it
has, 422 for a proof that fails, 403 for a signature by no key of the log, 404 for a log it does not
know, 400 for a malformed request; never a rollback, never two roots for one size, state kept."""

from __future__ import annotations

import base64
import hashlib
import struct

import pytest
from starlette.testclient import TestClient

from runledger.ledger.storage.locks import Busy
from runledger.ledger.tlog import checkpoint, cosignature, merkle, note, policy, witness
from runledger.ledger.tlog.cosignature import CosignVerifier, Cosigner

# florolf/sigsum-breakglass README, "Step 6": a checkpoint of a one-leaf log cosigned (cosignature/v1,
# Ed25519) by two witnesses, verified there by sigsum-verify; the body is the checkpoint its proof stands for
# (Sigsum's origin is "sigsum.org/v1/tree/" + hex(SHA-256(log key)))
PUBLISHED_BODY = ("sigsum.org/v1/tree/415e81ad656a4d1bd36f8f8d07703ed2bf0d00bf9e1a7e5c1f3fa2f1a90e7e61\n1\n"
                  + base64.b64encode(bytes.fromhex("12594afb57e40a283bd03afac74641a032065cd59e098278920f55dae9d6f505"))
                  .decode() + "\n")
PUBLISHED = [  # (witness public key, timestamp, Ed25519 signature)
    ("0356a86448e731c962782b30563d9d5c807f7956c4c361cf48ac75c6bd7fce0f", 1771286008,
     "39d88fc30e8a1df0df5c7b339fffbe1e1f34f1f3b67885db4ef47248f4f90dd77fe070ecefb8e9eba0a2d63781a05b2a7e18b96dfc95"
     "77478f2e4dc01e7f1005"),
    ("364ced2caf85261de3c91170f137c0bf8688fda3293372d66f02d6b7f4bab79c", 1771286014,
     "abf47128ba667057037124abf1c620ed912c2e1ac8921739094ec8ee19f1483f8132eb9f660a4000493ea8ee7502f13bb836486c45c586"
     "9d50015e169b49030f"),
]


def _spec_key_id(name: str, public: bytes) -> bytes:
    """tlog-cosignature: SHA-256(<name> || "\\n" || 0x04 || 32-byte Ed25519 public key)[:4]."""
    return hashlib.sha256(name.encode() + b"\n\x04" + public).digest()[:4]


def _line(name: str, public: bytes, ts: int, sig: bytes) -> str:
    return f"{note.DASH} {name} {base64.b64encode(_spec_key_id(name, public) + struct.pack('>Q', ts) + sig).decode()}"


def test_published_cosignatures_verify_and_give_their_timestamps():
    witnesses = [CosignVerifier(f"cosigner{i}", struct.unpack(">I", _spec_key_id(f"cosigner{i}", bytes.fromhex(k)))[0],
                                bytes.fromhex(k)) for i, (k, _, _) in enumerate(PUBLISHED, 1)]
    lines = [_line(w.name, w.public, ts, bytes.fromhex(sig)) for w, (_, ts, sig) in zip(witnesses, PUBLISHED)]
    signed = PUBLISHED_BODY + "\n" + "\n".join(lines) + "\n"
    assert cosignature.cosigners(signed, witnesses) == {witnesses[0]: 1771286008, witnesses[1]: 1771286014}
    assert cosignature.cosigners(signed, witnesses[1:]) == {witnesses[1]: 1771286014}  # others' lines: ignored
    forged = signed.replace("\n1\n", "\n2\n", 1)
    with pytest.raises(note.NoteError, match="cosigner1 does not verify"):
        cosignature.cosigners(forged, witnesses)
    later = PUBLISHED_BODY + "\n" + _line("cosigner1", witnesses[0].public, 1771286009, bytes.fromhex(PUBLISHED[0][2])) + "\n"
    with pytest.raises(note.NoteError):  # the timestamp is signed
        cosignature.cosigners(later, witnesses)


def test_a_cosignature_line_is_key_id_then_timestamp_then_signature_and_vkeys_round_trip(tmp_path):
    w = Cosigner.generate("witness.example/w1")
    line = w.cosign("example.com/log\n3\n" + "A" * 43 + "=\n", timestamp=1679315147)
    name, b64 = line.rstrip("\n").split(" ")[1:]
    raw = base64.b64decode(b64)
    assert name == "witness.example/w1" and len(raw) == 4 + 8 + 64
    assert raw[:4] == _spec_key_id(name, w.verifier.public) and struct.unpack(">Q", raw[4:12])[0] == 1679315147
    vkey = w.verifier.text()
    assert vkey.split("+")[2].startswith("B")  # base64 of 0x04 || key: the cosignature type
    assert CosignVerifier.parse(vkey) == w.verifier
    log_key = note.Signer.generate("example.com/log")
    with pytest.raises(note.NoteError, match="type 0x04"):
        CosignVerifier.parse(log_key.verifier.text())  # a log's key (type 0x01) is no witness's key
    with pytest.raises(note.NoteError, match="not the id"):
        CosignVerifier.parse(vkey.replace(vkey.split("+")[1], "00000000"))
    path = note.write_key(tmp_path / "w.key", w)
    assert path.stat().st_mode & 0o777 == 0o600 and cosignature.read_key(path) == w
    with pytest.raises(note.NoteError, match="type 0x04"):
        Cosigner.parse(log_key.text())


def test_a_log_signature_still_opens_with_cosignature_lines_beside_it():
    log_key, w = note.Signer.generate("example.com/log"), Cosigner.generate("example.com/log")  # even the same name
    cp = checkpoint.Checkpoint("example.com/log", 3, b"\x01" * 32)
    signed = checkpoint.sign(cp, log_key) + w.cosign(cp.text())
    assert checkpoint.open_signed(signed, [log_key.verifier]) == cp
    assert list(cosignature.cosigners(signed, [w.verifier])) == [w.verifier]


def _keys(n: int) -> list[Cosigner]:
    return [Cosigner.generate(f"w{i}.example") for i in range(n)]


def test_a_policy_with_groups_is_witnessed_by_its_quorum_and_names_the_missing():
    log_key = note.Signer.generate("example.com/log")
    ws = _keys(6)
    text = f"""# the spec's example
log {log_key.verifier.text()} https://example.com/log

witness X1 {ws[0].verifier.text()}
witness X2 {ws[1].verifier.text()} http://127.0.0.1:1/w
witness X3 {ws[2].verifier.text()}
group X-witnesses 2 X1 X2 X3
	witness Y1 {ws[3].verifier.text()}
witness Y2 {ws[4].verifier.text()}
witness Y3 {ws[5].verifier.text()}
group Y-witnesses any Y1 Y2 Y3
group X-and-Y all X-witnesses Y-witnesses
quorum X-and-Y
"""
    p = policy.parse(text)
    assert p.log_keys() == [log_key.verifier] and p.witnesses["X2"].url == "http://127.0.0.1:1/w"
    assert p.satisfied({"X1", "X3", "Y2"}) and not p.satisfied({"X1", "Y1", "Y2", "Y3"})
    assert p.missing({"X1", "Y1"}) == ["X2", "X3", "Y2", "Y3"]
    assert p.missing({"X1"}) == ["X2", "X3", "Y1", "Y2", "Y3"]
    assert policy.parse("quorum none\n").satisfied(set())


@pytest.mark.parametrize("text, why", [
    ("witness A {w0}\n", "no quorum"),
    ("witness A {w0}\nquorum B\n", "not a witness or group"),
    ("witness A {w0}\ngroup G 2 A\nquorum G\n", "threshold"),
    ("witness A {w0}\ngroup G any A A\nquorum G\n", "listed twice"),
    ("witness A {w0}\nwitness B {w0}\nquorum A\n", "public key listed twice"),
    ("witness A {w0}\nwitness A {w1}\nquorum A\n", "taken"),
    ("witness none {w0}\nquorum none\n", "taken"),
    ("witness A {w0}\nquorum A\nquorum A\n", "second quorum"),
    ("witness A {log}\nquorum A\n", "type 0x04"),
    ("log {w0}\nquorum none\n", "Ed25519 key"),
    ("witnesses A {w0}\nquorum A\n", "not a policy line"),
])
def test_a_policy_that_does_not_parse_says_why_and_where(text, why):
    ws = _keys(2)
    log_key = note.Signer.generate("example.com/log")
    with pytest.raises(policy.PolicyError, match=why):
        policy.parse(text.format(w0=ws[0].verifier.text(), w1=ws[1].verifier.text(), log=log_key.verifier.text()))


# -- the witness's add-checkpoint --

ORIGIN = "example.com/log"


class Tree:
    """A log in memory: its leaves, signed checkpoints of any size, consistency proofs."""

    def __init__(self, signer: note.Signer, seed: bytes = b"") -> None:
        self.signer, self.hashes = signer, [merkle.leaf_hash(seed + str(i).encode()) for i in range(64)]

    def signed(self, size: int, origin: str = ORIGIN) -> str:
        return checkpoint.sign(checkpoint.Checkpoint(origin, size, merkle.root_of(self.hashes[:size])), self.signer)

    def proof(self, old: int, new: int) -> list[bytes]:
        return merkle.consistency_proof(merkle.full_subtree_hashes(self.hashes[:new]), old, new) if 0 < old < new else []


@pytest.fixture
def setup(tmp_path):
    log_key = note.Signer.generate(ORIGIN)
    w = Cosigner.generate("witness.example/w1")
    wit = witness.Witness(tmp_path / "state", w, [log_key.verifier])
    with TestClient(witness.app(wit)) as client:
        yield client, Tree(log_key), w, wit


def _add(client, old: int, proof: list[bytes], signed: str):
    return client.post("/add-checkpoint", content=checkpoint.add_checkpoint_body(old, proof, signed))


def test_a_first_checkpoint_is_cosigned_then_each_that_extends_it(setup):
    client, tree, w, wit = setup
    r = _add(client, 0, [], tree.signed(5))
    assert r.status_code == 200 and r.text.startswith(f"{note.DASH} witness.example/w1 ")
    assert list(cosignature.cosigners(tree.signed(5) + r.text, [w.verifier])) == [w.verifier]
    r = _add(client, 5, tree.proof(5, 13), tree.signed(13))
    assert r.status_code == 200 and wit.known() == {ORIGIN: 13}
    assert _add(client, 13, [], tree.signed(13)).status_code == 200  # the same checkpoint again: cosigned again


def test_an_old_size_that_is_not_the_witnesses_gets_409_and_its_size(setup):
    client, tree, _, _ = setup
    assert _add(client, 0, [], tree.signed(8)).status_code == 200
    r = _add(client, 0, [], tree.signed(9))
    assert r.status_code == 409 and r.text == "8\n" and r.headers["content-type"] == "text/x.tlog.size"
    r = _add(client, 4, tree.proof(4, 9), tree.signed(9))
    assert r.status_code == 409 and r.text == "8\n"
    assert _add(client, 8, tree.proof(8, 9), tree.signed(9)).status_code == 200


def test_a_proof_that_fails_gets_422_and_moves_nothing(setup):
    client, tree, _, wit = setup
    assert _add(client, 0, [], tree.signed(6)).status_code == 200
    other = Tree(tree.signer, seed=b"x")  # the log's key, another tree
    r = _add(client, 6, other.proof(6, 20), other.signed(20))
    assert r.status_code == 422 and wit.known() == {ORIGIN: 6}
    assert _add(client, 0, [b"\x00" * 32], tree.signed(6)).status_code == 409  # (old 0: the witness has 6)


def test_two_roots_for_one_size_the_second_is_refused_and_never_cosigned(setup):
    client, tree, _, wit = setup
    assert _add(client, 0, [], tree.signed(10)).status_code == 200
    fork = Tree(tree.signer, seed=b"fork").signed(10)
    for old in (0, 10):
        r = _add(client, old, [], fork)
        assert r.status_code == 409 and r.text == "10\n" and note.DASH not in r.text
    assert wit.known() == {ORIGIN: 10}


def test_a_smaller_checkpoint_never_rolls_the_witness_back(setup, tmp_path):
    client, tree, w, wit = setup
    assert _add(client, 0, [], tree.signed(12)).status_code == 200
    assert _add(client, 12, [], tree.signed(7)).status_code == 400  # old size above the checkpoint's
    assert _add(client, 0, [], tree.signed(7)).status_code == 409
    assert wit.known() == {ORIGIN: 12}


def test_a_signature_by_no_key_of_the_log_gets_403_an_unknown_log_404(setup):
    client, tree, _, _ = setup
    impostor = Tree(note.Signer.generate(ORIGIN))  # the log's name, another key
    assert _add(client, 0, [], impostor.signed(3)).status_code == 403
    stranger = Tree(note.Signer.generate("stranger.example/log"))
    assert _add(client, 0, [], stranger.signed(3, "stranger.example/log")).status_code == 404
    assert _add(client, 0, [], tree.signed(3, ORIGIN + "/p2")).status_code == 200  # a partition's log: its key's


@pytest.mark.parametrize("body", [
    b"", b"old 0\n", b"old 01\n\n{cp}", b"old -1\n\n{cp}", b"old 0\nnot base64!\n\n{cp}", b"old 0\nAAAA\n\n{cp}",
    b"\xff\xfe\n\n{cp}", b"old 99\n\n{cp}", b"old 0\n" + (b"A" * 43 + b"=\n") * 64 + b"\n{cp}",
])
def test_a_malformed_request_gets_400(setup, body):
    client, tree, _, wit = setup
    r = client.post("/add-checkpoint", content=body.replace(b"{cp}", tree.signed(3).encode()))
    assert r.status_code == 400 and wit.known() == {}


def test_the_state_outlives_the_witness_and_one_witness_holds_it(setup, tmp_path):
    client, tree, w, wit = setup
    assert _add(client, 0, [], tree.signed(9)).status_code == 200
    with pytest.raises(Busy):
        witness.Witness(tmp_path / "state", w, [tree.signer.verifier])
    wit.close()
    again = witness.Witness(tmp_path / "state", w, [])  # even with no key given for the log: not forgotten
    assert again.known() == {ORIGIN: 9}
    again.close()
    again = witness.Witness(tmp_path / "state", w, [tree.signer.verifier])
    with TestClient(witness.app(again)) as c2:
        assert _add(c2, 0, [], tree.signed(9)).text == "9\n"


def test_witness_keygen_makes_a_0600_key_once_and_key_prints_its_vkey(tmp_path, capsys):
    from runledger.tools.cli import main

    key = tmp_path / "keys" / "witness.key"
    assert main(["witness", "keygen", "--name", "witness.example/w1", "--out", str(key)]) == 0
    vkey = capsys.readouterr().out.strip()
    assert CosignVerifier.parse(vkey).name == "witness.example/w1" and key.stat().st_mode & 0o777 == 0o600
    assert main(["witness", "key", "--key", str(key)]) == 0 and capsys.readouterr().out.strip() == vkey
    assert main(["witness", "keygen", "--name", "again", "--out", str(key)]) == 2
    assert main(["witness", "keygen", "--name", "bad name", "--out", str(tmp_path / "k2")]) == 2
    assert main(["tlog", "audit", "--log", str(tmp_path), "--events", str(tmp_path)]) == 2  # no log key, no policy
    (tmp_path / "p.txt").write_text(f"witness W1 {vkey}\n")
    assert main(["tlog", "audit", "--log", str(tmp_path), "--events", str(tmp_path), "--policy", str(tmp_path / "p.txt")]) == 2
    assert "no quorum line" in capsys.readouterr().err


def test_cosignatures_join_the_checkpoint_they_cosign_and_only_that_one(tmp_path):
    from runledger.ledger.tlog import log as tlog

    lg = tlog.Log(tmp_path / "root", None, note.Signer.generate(ORIGIN))
    lg.open([])
    lg.append_entries([b"a", b"b", b"c"])
    signed = lg.sign()
    w1, w2 = _keys(2)
    text = note.signatures(signed)[0]
    assert lg.attach_cosignatures(signed, [w1.cosign(text, 100).rstrip("\n"), w2.cosign(text, 100).rstrip("\n")])
    assert lg.attach_cosignatures(signed, [w1.cosign(text, 200).rstrip("\n")])  # w1 again: its line replaced
    now = (lg.dir / "checkpoint").read_text()
    assert checkpoint.open_signed(now, [lg.signer.verifier]).size == 3
    assert cosignature.cosigners(now, [w1.verifier, w2.verifier]) == {w1.verifier: 200, w2.verifier: 100}
    assert len(note.signatures(now)[1]) == 3
    lg.append_entries([b"d"])
    newer = lg.sign()
    assert not lg.attach_cosignatures(signed, [w1.cosign(text, 300).rstrip("\n")])  # a checkpoint since replaced
    assert (lg.dir / "checkpoint").read_text() == newer
