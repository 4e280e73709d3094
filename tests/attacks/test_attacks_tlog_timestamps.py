"""Timestamps against backdating and forgery: a ledger whose $RUNLEDGER_TLOG_TSA names a local RFC 3161
authority (`openssl ts`, support.tsa) keeps the authority's token over each checkpoint at
`tlog/timestamp/<size>.tsr`, and `runledger tlog audit --tsa-certs` checks every token it finds. The
promise attacked: whoever holds the root cannot show a timestamp the authority did not give for that
checkpoint: a token edited (bytes flipped, its genTime moved back), one from another authority, one over
another checkpoint swapped in, or bytes that are no token, are refused with one line naming the
checkpoint; a missing one is said, and fails the audit only when timestamps are required. Nor can a
producer date an event later than the token over a checkpoint that holds it: the audit names it."""

from __future__ import annotations

import datetime
import hashlib
import re
import subprocess
from pathlib import Path

import pytest

from runledger.ledger.contract.events import subject_for
from runledger.ledger.emit.sealing import seal
from runledger.ledger.ingest import service
from runledger.ledger.ingest.partitions import Part, partition_of
from runledger.ledger.tlog import audit, timestamping, timestamps, tiles
from runledger.tools.cli import main
from support.batches import batch_for
from support.tlogs import tlog_audit
from support.tsa import OPENSSL, LocalTSA

STAMPS_S = 60  # a round with the authority (an openssl process) on a loaded 2-core machine


@pytest.fixture
def tsa(tmp_path, monkeypatch):
    """A local authority the ledgers of this test ask, every checkpoint (no fair-use interval)."""
    t = LocalTSA(tmp_path / "tsa").start()
    monkeypatch.setenv(timestamps.TSA_ENV, t.url)
    monkeypatch.setenv(timestamps.TSA_CERTS_ENV, str(t.certs))
    monkeypatch.setenv(timestamping.EVERY_ENV, "0")
    yield t
    t.stop()


def _store_stamped(ledger: service.Ledger, msgs) -> int:
    """Store `msgs`, sign, and wait for the checkpoint's token; its size."""
    ledger.write(ledger.decode(msgs))
    ledger.commit()
    ledger.tlog.sign()
    assert ledger.tlog.timestamping.wait_idle(STAMPS_S)
    size = ledger.tlog.size
    assert (ledger.tlog.dir / timestamps.path_of(size)).exists(), ledger.tlog.timestamping.failing
    return size


def _audit_stamped(root: Path, tsa: LocalTSA, capsys, *extra: str) -> tuple[int, str]:
    return tlog_audit(root, capsys, "--tsa-certs", str(tsa.certs), *extra)


def _log_vkey() -> str:
    from runledger.ledger.tlog import log as tlog

    return tlog.load_or_make_key().verifier.text()


@pytest.fixture
def stamped(root, tsa):
    """A root whose log has two stamped checkpoints (sizes 30 and 55): (ledger, sizes)."""
    ledger = service.Ledger(root)
    sizes = [_store_stamped(ledger, batch_for(["run-1"], 30)),
             _store_stamped(ledger, batch_for(["run-2"], 25, first_sseq=31))]
    assert sizes == [30, 55]
    return ledger, sizes


def test_each_checkpoint_is_timestamped_and_the_audit_checks_every_token(root, tsa, stamped, capsys, tmp_path):
    ledger, _ = stamped
    rc, out = _audit_stamped(root, tsa, capsys, "--require-timestamps")
    assert rc == 0 and "size 55" in out and "timestamped 20" in out and "by CN=test TSA" in out, out
    assert "(2 timestamp(s) checked)" in out, out
    token = ledger.tlog.dir / timestamps.path_of(55)  # a standard token: openssl checks it as well
    text = tiles.Tiles(ledger.tlog.dir).checkpoint().split("\n\n")[0] + "\n"
    r = subprocess.run([OPENSSL, "ts", "-verify", "-digest", hashlib.sha256(text.encode()).hexdigest(), "-in",
                        str(token), "-CAfile", str(tsa.certs)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Verification: OK" in r.stdout, r.stdout + r.stderr
    out_file = tmp_path / "proof.tsr"
    assert main(["tlog", "prove", "run-2:worker-0:0:3", "--root", str(root), "--timestamp", str(out_file)]) == 0
    assert out_file.read_bytes() == token.read_bytes()


def _flip_signature(token: bytes, other: bytes) -> bytes:
    return token[:-1] + bytes([token[-1] ^ 1])  # (the last byte: the authority's signature)


def _backdate(token: bytes, other: bytes) -> bytes:
    m = re.search(rb"\x18\x0f(\d{14}Z)", token)  # genTime, a GeneralizedTime in the signed TSTInfo
    return token[:m.start(1)] + b"2001" + token[m.start(1) + 4:]


def _earlier_checkpoints(token: bytes, other: bytes) -> bytes:
    return other  # the authority's genuine token over size 30, as size 55's


def _not_a_token(token: bytes, other: bytes) -> bytes:
    return b"\x30\x03\x02\x01\x00"


@pytest.mark.parametrize("forge,why", [
    (_flip_signature, "its signature does not check against the authority's certificates"),
    (_backdate, "its signature does not check against the authority's certificates"),
    (_earlier_checkpoints, "it stamps another message, not this checkpoint's text"),
    (_not_a_token, "not an RFC 3161 reply"),
])
def test_an_edited_or_swapped_token_is_refused(root, tsa, stamped, capsys, forge, why):
    ledger, _ = stamped
    assert _audit_stamped(root, tsa, capsys)[0] == 0
    path = ledger.tlog.dir / timestamps.path_of(55)
    path.write_bytes(forge(path.read_bytes(), (ledger.tlog.dir / timestamps.path_of(30)).read_bytes()))
    rc, out = _audit_stamped(root, tsa, capsys)
    assert rc == 1 and "the timestamp of checkpoint size 55 is refused" in out and why in out, out
    assert out.count("\n") == 1, out  # one line


def test_a_token_from_another_authority_is_refused(root, tsa, stamped, capsys, tmp_path):
    ledger, _ = stamped
    other = LocalTSA(tmp_path / "other", name="test TSA").start()  # the same name, its own keys
    try:
        text = tiles.Tiles(ledger.tlog.dir).checkpoint().split("\n\n")[0] + "\n"
        reply, _ = timestamps.Authority.load(other.certs, other.url).request(text, 55)
    finally:
        other.stop()
    (ledger.tlog.dir / timestamps.path_of(55)).write_bytes(reply)
    rc, out = _audit_stamped(root, tsa, capsys)
    assert rc == 1 and "checkpoint size 55 is refused: its signature does not check" in out, out


def test_an_old_token_is_checked_against_the_root_of_its_size(root, tsa, stamped, capsys):
    ledger, _ = stamped  # size 30's token, relabelled as size 31's (no checkpoint of 31 was stamped)
    (ledger.tlog.dir / timestamps.path_of(31)).write_bytes((ledger.tlog.dir / timestamps.path_of(30)).read_bytes())
    rc, out = _audit_stamped(root, tsa, capsys)
    assert rc == 1 and "checkpoint size 31 is refused: it stamps another message" in out, out


def test_a_missing_token_is_said_and_fails_only_when_required(root, tsa, stamped, capsys):
    ledger, _ = stamped
    (ledger.tlog.dir / timestamps.path_of(55)).unlink()
    rc, out = _audit_stamped(root, tsa, capsys)
    assert rc == 0 and "checkpoint size 55 has no timestamp (the latest stamped: size 30, 20" in out, out
    rc, out = _audit_stamped(root, tsa, capsys, "--require-timestamps")
    assert rc == 1 and "checkpoint size 55 has no timestamp" in out and "timestamps are required" in out, out


def test_a_reply_the_authority_did_not_grant_is_never_kept(root, tsa, capsys):
    tsa.config.write_text(tsa.config.read_text().replace("digests = sha256, sha384, sha512", "digests = sha512"))
    ledger = service.Ledger(root)  # (the authority now answers 200 with a rejection: SHA-256 not supported)
    ledger.write(ledger.decode(batch_for(["run-1"], 10)))
    ledger.commit()
    ledger.tlog.sign()
    assert ledger.tlog.timestamping.wait_idle(STAMPS_S)
    assert "did not grant it (status 2" in ledger.tlog.timestamping.failing
    assert timestamps.sizes_in(ledger.tlog.dir) == [] and tsa.requests >= 1
    rc, out = _audit_stamped(root, tsa, capsys)
    assert rc == 0 and "checkpoint size 10 has no timestamp" in out, out


def _step_at(run: str, when: datetime.datetime, sseq: int) -> list[tuple[str, bytes, int]]:
    """A step event its producer dated `when` (sealed so: its hash covers the time), as a message."""
    env, text = seal(run, "worker-0", 0, 0, "step", {"loss": 1.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 8,
                                                     "step_time_s": 0.1}, 0,
                     "", when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
    return [(subject_for(run, "step"), text.encode(), sseq)]


def test_an_event_dated_after_the_timestamp_that_holds_it_is_named(root, tsa, stamped, capsys):
    ledger, _ = stamped  # (their events are dated when sealed, before their checkpoints were stamped: they pass)
    now = datetime.datetime.now(datetime.timezone.utc)
    skewed = now + datetime.timedelta(seconds=audit.MAX_CLOCK_SKEW_S / 5)  # a producer's clock a little ahead
    assert _store_stamped(ledger, _step_at("run-3", skewed, 56)) == 56
    rc, out = _audit_stamped(root, tsa, capsys, "--require-timestamps")
    assert rc == 0 and "(3 timestamp(s) checked)" in out, out
    later = now + datetime.timedelta(hours=1)  # an event that says it came an hour after it was logged and stamped
    assert _store_stamped(ledger, _step_at("run-4", later, 57)) == 57
    rc, out = _audit_stamped(root, tsa, capsys)
    assert rc == 1 and out.count("\n") == 1, out
    assert "event run-4/worker-0/0/0 says it happened at " in out and "but checkpoint size 57 holding it was " \
        "timestamped" in out and "its time is not true" in out, out


def test_each_partitions_log_is_stamped_and_audited_as_its_own(root, tsa, capsys):
    k = 2
    runs = {p: [r for r in (f"run-{i}" for i in range(20)) if partition_of(r, k) == p][:2] for p in range(k)}
    ledgers = [service.Ledger(root, position=Part(k, p)) for p in range(k)]
    assert _store_stamped(ledgers[0], batch_for(runs[0][:1], 10)) == 10
    assert _store_stamped(ledgers[1], batch_for(runs[1][:1], 7, first_sseq=11)) == 7
    origins = [ledger.tlog.signer.verifier.name + f"/p{p}" for p, ledger in enumerate(ledgers)]
    assert [timestamps.sizes_in(root / f"tlog/p{p}") for p in range(k)] == [[10], [7]]
    rc, out = _audit_stamped(root, tsa, capsys, "--require-timestamps")
    assert rc == 0 and f"log {origins[0]}: size 10" in out and f"log {origins[1]}: size 7" in out, out
    assert out.count("(1 timestamp(s) checked)") == 2, out
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    assert _store_stamped(ledgers[1], _step_at(runs[1][1], later, 18)) == 8  # dated after p1's stamp over it
    rc, out = _audit_stamped(root, tsa, capsys)
    assert rc == 1 and f"{origins[1]}: event {runs[1][1]}/worker-0/0/0 says it happened at " in out, out
    token = (root / "tlog/p0" / timestamps.path_of(10)).read_bytes()  # p0's genuine token, as p1's of size 8
    (root / "tlog/p1" / timestamps.path_of(8)).write_bytes(token)
    rc, out = _audit_stamped(root, tsa, capsys)
    assert rc == 1 and f"{origins[1]}: the timestamp of checkpoint size 8 is refused: it stamps another" in out, out
