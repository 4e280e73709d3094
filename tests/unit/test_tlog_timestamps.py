"""RFC 3161 timestamps, without an authority: the configuration is refused in one line when it cannot
give checked tokens (no certificates, no root among them, not a URL, rfc3161-client missing) and the log
goes on unstamped; tokens are found by the size of their checkpoint and served by the dashboard beside
the tiles; the audit counts tokens it was given no certificates for, and wants certificates before it
can require timestamps. (Tokens from a real authority: tests/attacks/test_attacks_tlog_timestamps.py.)"""

from __future__ import annotations

import datetime
import logging
import sys
import threading
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from starlette.testclient import TestClient

from runledger.ledger.tlog import audit, timestamping, timestamps
from runledger.ledger.tlog import log as tlog
from runledger.tools.cli import main
from runledger.ui.access import configure
from runledger.ui.app import create_app
from support.tables import write_batches


def _cert(name: str, issuer: str | None = None) -> bytes:
    """A PEM certificate of `name`, self-signed unless `issuer` is named (signed by a throwaway key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer or name)]))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def test_an_authority_is_its_roots_and_intermediates(tmp_path):
    pem = tmp_path / "tsa.pem"
    pem.write_bytes(_cert("tsa root") + _cert("tsa intermediate", issuer="tsa root"))
    a = timestamps.Authority.load(pem, "http://tsa.example/")
    assert [len(a.roots), len(a.intermediates)] == [1, 1] and a.url == "http://tsa.example/"
    pem.write_bytes(_cert("tsa", issuer="tsa root"))
    with pytest.raises(timestamps.TimestampRefused, match="no self-signed root"):
        timestamps.Authority.load(pem)
    pem.write_text("not a certificate")
    with pytest.raises(timestamps.TimestampRefused, match="not PEM certificates"):
        timestamps.Authority.load(pem)
    with pytest.raises(timestamps.TimestampRefused, match="No such file"):
        timestamps.Authority.load(tmp_path / "missing.pem")


def test_a_configuration_that_cannot_give_checked_tokens_is_said_and_the_log_goes_on(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.ERROR, logger="runledger.ledger.tlog.timestamping")
    monkeypatch.delenv(timestamps.TSA_ENV, raising=False)
    assert timestamps.from_env() is None and timestamping.for_log(tmp_path, tlog.write_file) is None and not caplog.records
    monkeypatch.setenv(timestamps.TSA_ENV, "tsa.example")
    assert timestamping.for_log(tmp_path, tlog.write_file) is None
    monkeypatch.setenv(timestamps.TSA_ENV, "http://tsa.example/")
    assert timestamping.for_log(tmp_path, tlog.write_file) is None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "not an http(s) URL" in said[0] and f"not ${timestamps.TSA_CERTS_ENV}" in said[1], said
    assert all("\n" not in s for s in said)


def test_without_rfc3161_client_the_ledger_logs_unstamped_and_says_why(root, tmp_path, monkeypatch, caplog):
    pem = tmp_path / "tsa.pem"
    pem.write_bytes(_cert("tsa root"))
    monkeypatch.setitem(sys.modules, "rfc3161_client", None)  # (as on a base install: import fails)
    monkeypatch.setenv(timestamps.TSA_ENV, "http://127.0.0.1:9/")
    monkeypatch.setenv(timestamps.TSA_CERTS_ENV, str(pem))
    caplog.set_level(logging.ERROR, logger="runledger.ledger.tlog.timestamping")
    write_batches(root, 2)
    lg = tlog.open_for(root, None, tlog.stored_events(root))
    assert lg.size == 2 * 7 and lg.timestamping is None and (lg.dir / "checkpoint").exists()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "pip install 'runledger[attest]'" in said[0], said
    assert main(["tlog", "audit", "--log", str(root / "tlog"), "--vkey", lg.signer.verifier.text(),
                 "--events", str(root), "--tsa-certs", str(pem)]) == 2  # one line, exit 2: bad usage here


def test_tokens_are_named_by_their_checkpoints_size_and_served_beside_the_tiles(root):
    write_batches(root, 1)
    lg = tlog.open_for(root, None, tlog.stored_events(root))
    (lg.dir / timestamps.FOLDER).mkdir()
    for size in (3, 7, 12):
        tlog.write_file(lg.dir / timestamps.path_of(size), b"\x30\x00" + bytes([size]))
    (lg.dir / timestamps.FOLDER / "notes.txt").write_text("x")
    assert timestamps.sizes_in(lg.dir) == [3, 7, 12] and timestamps.path_of(7) == "timestamp/7.tsr"
    with TestClient(create_app(root, None, configure("127.0.0.1")), base_url="http://127.0.0.1:8765") as c:
        r = c.get("/tlog/timestamp/7.tsr")
        assert r.status_code == 200 and r.content == b"\x30\x00\x07"
        assert r.headers["content-type"] == "application/timestamp-reply" and "immutable" in r.headers["cache-control"]
        for bad in ("/tlog/timestamp/notes.txt", "/tlog/timestamp/..%2F..%2Fcatalog.db", "/tlog/timestamp/x.tsr"):
            assert c.get(bad).status_code == 404, bad


def test_the_audit_counts_tokens_it_cannot_check_and_wants_certificates_to_require_them(root, tmp_path, capsys):
    write_batches(root, 1)
    lg = tlog.open_for(root, None, tlog.stored_events(root))
    vkey = lg.signer.verifier
    done = audit.audit(str(lg.dir), [vkey], root, seen=tmp_path / "seen", stamps=audit.Stamps())
    assert "size 7" in done.text() and ", no timestamp" in done.text()
    tlog.write_file(lg.dir / timestamps.path_of(lg.size), b"not checked")
    done = audit.audit(str(lg.dir), [vkey], root, seen=tmp_path / "seen", stamps=audit.Stamps())
    assert "1 timestamp(s) not checked (no authority's certificates given)" in done.text()
    rc = main(["tlog", "audit", "--log", str(lg.dir), "--vkey", vkey.text(), "--events", str(root),
               "--require-timestamps"])
    assert rc == 2 and "--tsa-certs" in capsys.readouterr().err


class _Authority(timestamps.Authority):
    """An authority in-process: it answers `request` with a fixed reply after `gate` opens, failing the first
    `fails` times; the sizes it was asked for are kept."""

    def __init__(self, fails: int = 0) -> None:
        super().__init__("http://authority.test/", (), ())
        object.__setattr__(self, "asked", [])
        object.__setattr__(self, "fails", [fails])
        object.__setattr__(self, "gate", threading.Event())
        self.gate.set()

    def request(self, text: str, size: int):
        self.asked.append(size)
        self.gate.wait(30)
        if self.fails[0]:
            self.fails[0] -= 1
            raise timestamps.TimestampRefused("unreachable (test)")
        return b"token of %d" % size, timestamps.Stamp(size, datetime.datetime.now(datetime.timezone.utc), "test")


def _signed_checkpoint(size: int) -> str:
    from runledger.ledger.tlog import checkpoint, note

    return checkpoint.sign(checkpoint.Checkpoint("test.example/log", size, bytes(32)), note.Signer.generate("test.example/log"))


def _until(done, within_s: float = 30) -> None:
    deadline = time.monotonic() + within_s
    while not done():
        assert time.monotonic() < deadline, "not done in time"
        time.sleep(0.01)


def test_only_the_newest_checkpoint_waiting_is_asked_for(tmp_path):
    authority = _Authority()
    ts = timestamping.Timestamping(tmp_path, authority, tlog.write_file, every_s=0)
    authority.gate.clear()  # the authority is slow: three checkpoints are signed while it stamps the first
    ts.submit(_signed_checkpoint(5))
    _until(lambda: authority.asked)
    ts.submit(_signed_checkpoint(6))
    ts.submit(_signed_checkpoint(7))
    authority.gate.set()
    assert ts.wait_idle(30)
    assert authority.asked == [5, 7] and ts.stamped == [5, 7]
    assert (tmp_path / timestamps.path_of(7)).read_bytes() == b"token of 7"
    ts.submit(_signed_checkpoint(7))  # (signed before a restart: asked again only if it has no token)
    ts.submit(_signed_checkpoint(0))  # (an empty log's checkpoint stamps nothing)
    assert ts.wait_idle(30) and authority.asked == [5, 7]


def test_an_authority_that_fails_is_asked_again_and_said_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(timestamping, "RETRY_S", 0.01)
    caplog.set_level(logging.INFO, logger="runledger.ledger.tlog.timestamping")
    authority = _Authority(fails=3)
    ts = timestamping.Timestamping(tmp_path, authority, tlog.write_file, every_s=0)
    ts.submit(_signed_checkpoint(4))
    assert ts.wait_idle(30)
    _until((tmp_path / timestamps.path_of(4)).exists)  # asked again with no new checkpoint
    assert ts.wait_idle(30) and authority.asked == [4, 4, 4, 4] and ts.failing is None
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [lv for lv, _ in said] == [logging.WARNING, logging.INFO], said
    assert "did not stamp test.example/log size 4: unreachable (test)" in said[0][1] and "again" in said[1][1]
