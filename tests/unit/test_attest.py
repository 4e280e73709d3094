"""Model checkpoints attested (runledger.ledger.attest): a folder signed with model signing's local EC key and
described by an in-toto SLSA provenance statement; the key made once, 0600; the statement's shape; a folder
changed after signing refused by model signing's verifier and by ours. (The ledger's side: tests/attacks.)"""

from __future__ import annotations

import hashlib
import json
import stat

import pytest

from runledger.ledger import attest
from runledger.ledger.contract.events import KINDS, REGISTRY, CheckpointAttested
from support.attesting import CONFIG, SOURCES, attest_folder, flip_a_byte, model_folder, read_as_in_toto

pytest.importorskip("model_signing", reason="the [attest] extra")


def test_the_key_is_made_once_owner_only_and_its_public_half_beside_it(user_data):
    key = attest.load_or_make_key()
    assert key == attest.key_file() and key.name == "attest.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert attest.load_or_make_key() == key and attest.public_file(key).read_bytes() == attest.public_pem(key)
    assert len(attest.key_id(attest.public_pem(key))) == 64


def test_a_key_others_may_read_is_refused(user_data):
    key = attest.load_or_make_key()
    key.chmod(0o644)
    with pytest.raises(ValueError, match="readable by others"):
        attest.load_or_make_key()


def test_the_statement_is_slsa_provenance_of_the_signed_digest(tmp_path, user_data):
    folder = model_folder(tmp_path / "step_00000004")
    event = attest_folder(folder)
    data = (folder / attest.STATEMENT).read_bytes()
    st = json.loads(data)
    assert attest.statement_bytes(st) == data  # canonical JSON, as hashed
    assert event.statement_sha256 == hashlib.sha256(data).hexdigest()
    assert st["_type"] == "https://in-toto.io/Statement/v1" and st["predicateType"] == "https://slsa.dev/provenance/v1"
    assert st["subject"] == [{"name": "r1/step_00000004", "digest": {"sha256": event.subject_sha256},
                              "annotations": {"content_hash": "f" * 64}}]
    assert event.subject_sha256 == attest.signed_subject(folder / attest.SIGNATURE)
    build = st["predicate"]["buildDefinition"]
    assert build["buildType"] == attest.BUILD_TYPE
    assert build["externalParameters"] == {"config": CONFIG, "config_hash": "c" * 64}
    deps = {d["name"]: d["digest"] for d in build["resolvedDependencies"]}
    assert deps == {"data/web/web/00.txt": {"sha256": SOURCES[0]["sha256"]},
                    "code": {"gitCommit": "0123456789abcdef0123456789abcdef01234567"}}
    details = st["predicate"]["runDetails"]
    assert details["builder"]["id"] == attest.BUILDER_ID
    assert details["metadata"]["invocationId"] == "r1:worker-0:0"
    # no root: no log checkpoint named, and the statement says so rather than inventing one
    assert details["byproducts"] == [] and event.tlog_size is None
    assert build["internalParameters"]["tlog_checkpoint"].startswith("none available")
    assert event.key_id == attest.key_id(attest.public_pem(attest.key_file()))


def test_an_attested_folder_verifies_and_an_edited_one_is_refused_by_both_verifiers(tmp_path, user_data):
    from model_signing import verifying

    folder = model_folder(tmp_path / "step_00000004")
    attest_folder(folder)
    public = attest.public_pem(attest.key_file())
    assert attest.verify(folder, public=public, root=None).startswith("ok: ")
    flip_a_byte(folder / "state" / "d" / "0.data")
    with pytest.raises(ValueError, match="state/d/0.data"):  # model signing's own verifier
        verifying.Config().use_elliptic_key_verifier(public_key=attest.public_file(attest.key_file())).verify(
            folder, folder / attest.SIGNATURE)
    with pytest.raises(attest.AttestFailed, match=r"state/d/0\.data: not the bytes signed") as err:
        attest.verify(folder, public=public, root=None)
    assert "\n" not in str(err.value)


def test_an_edited_statement_no_longer_verifies(tmp_path, user_data):
    folder = model_folder(tmp_path / "step_00000004")
    attest_folder(folder)
    st = json.loads((folder / attest.STATEMENT).read_bytes())
    st["subject"][0]["digest"]["sha256"] = "0" * 64
    (folder / attest.STATEMENT).write_bytes(attest.statement_bytes(st))
    with pytest.raises(attest.AttestFailed, match="not the digest model signing signed"):
        attest.verify(folder, public=attest.public_pem(attest.key_file()), root=None)


def test_the_attestation_kind_is_the_workers():
    assert KINDS["attestation"] is CheckpointAttested and REGISTRY["attestation"].publishers == ("worker",)
    with pytest.raises(ValueError):
        CheckpointAttested(path="p", subject_sha256="x", statement_sha256="0" * 64, key_id="0" * 64)


def test_the_attester_emits_in_the_background_and_a_failure_is_said_not_raised(tmp_path, user_data, caplog):
    from runledger.ledger.emit.sink import ListSink

    rec = ListSink("worker-0")
    attester = attest.Attester(rec, root=None, run={"run_id": "r1", "producer": "worker-0", "attempt": 0},
                               data_sources=SOURCES, code_commit=None)
    good = model_folder(tmp_path / "step_00000002")
    attester.submit(tmp_path / "step_00000001", 1, config=CONFIG, config_hash="c" * 64, content_hash=None)  # (no folder)
    attester.submit(good, 2, config=CONFIG, config_hash="c" * 64, content_hash="f" * 64, tokens_seen=64)
    attester.close()
    assert [(s, p["path"]) for s, p in rec.payloads("attestation")] == [(2, str(good.resolve()))]
    assert any("step_00000001 not attested" in r.getMessage() for r in caplog.records)
    st = json.loads((good / attest.STATEMENT).read_bytes())
    internal = st["predicate"]["buildDefinition"]["internalParameters"]
    assert internal["step"] == 2 and internal["tokens_seen"] == 64 and internal["code_commit"] is None
    assert all(d["name"] != "code" for d in st["predicate"]["buildDefinition"]["resolvedDependencies"])


def test_the_statement_parses_as_in_totos_own_statement_and_slsa_provenance(tmp_path, user_data):
    """in-toto's reference protos read it as written: no unknown field, every resource descriptor valid."""
    pytest.importorskip("in_toto_attestation")
    folder = model_folder(tmp_path / "step_00000004")
    attest_folder(folder)
    prov = read_as_in_toto(json.loads((folder / attest.STATEMENT).read_bytes()))
    assert prov.build_definition.build_type == attest.BUILD_TYPE and prov.run_details.metadata.started_on.seconds
