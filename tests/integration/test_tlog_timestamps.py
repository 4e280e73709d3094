"""A ledger with a time-stamping authority (a local `openssl ts`, support.tsa): the served ledger
(`runledger ledger serve --tsa URL --tsa-certs PEM`, a child process fed by a real nats-server) gets its
checkpoints stamped and `runledger tlog audit --require-timestamps` passes from the public files (a folder,
and the dashboard's URL); with the
authority down, ingest goes on, the events are stored and logged, the failure is said once, and the
checkpoint is stamped when the authority is back, with no new event to prompt it."""

from __future__ import annotations

import logging
import time

from runledger.ledger.ingest import service
from runledger.ledger.storage.reads import read_events
from runledger.ledger.tlog import chainheads, timestamping, timestamps
from runledger.ledger.tlog import log as tlog
from support.batches import batch_for
from support.processes import LedgerProcess, cli, start_producer, wait_serving
from support.tsa import LocalTSA
from support.ui import UiProcess

WAIT_S = 120  # a ledger process starting, storing and a round with the authority, on a loaded 2-core machine


def _audit_cli(root, tsa: LocalTSA, *extra: str, log: str | None = None):
    return cli("tlog", "audit", "--log", log or str(root / "tlog"), "--vkey", tlog.load_or_make_key().verifier.text(),
               "--events", str(root), "--tsa-certs", str(tsa.certs), *extra)


def _wait_for(path, what: str, log_text=lambda: "") -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"no {what}: {log_text()}"
        time.sleep(0.2)


def test_a_served_ledger_gets_its_checkpoints_timestamped(tmp_path, nats_server, root, monkeypatch):
    tsa = LocalTSA(tmp_path / "tsa").start()
    monkeypatch.setenv(timestamping.EVERY_ENV, "0")  # (the ledger process inherits it: every checkpoint asked)
    # the log's size: the producer's 40 steps, and with signed heads on the chain_head its close seals (the one
    # head: none at the publisher's rounds, so long apart)
    monkeypatch.setenv(chainheads.INTERVAL_ENV, "3600")
    size = 40 + chainheads.enabled()
    lp = LedgerProcess(root, nats_server.url, tmp_path / "ledger.log", "--tsa", tsa.url, "--tsa-certs", str(tsa.certs))
    try:
        lp.start()
        wait_serving(lp)
        producer = start_producer(nats_server.url, tmp_path / "spool", "stamped", "worker-0", 40)
        assert producer.wait(timeout=WAIT_S) == 0, producer.stderr.read()
        _wait_for(root / "tlog" / timestamps.path_of(size), f"timestamp of size {size}",
                  lambda: lp.log_path.read_text()[-3000:])
        r = _audit_cli(root, tsa, "--require-timestamps")
        assert r.returncode == 0 and f"size {size}" in r.stdout and "timestamped" in r.stdout, r.stdout + r.stderr
        ui = UiProcess(root, tmp_path / "ui.log")  # the dashboard serves the token beside the tiles
        try:
            r = _audit_cli(root, tsa, "--require-timestamps", log=ui.base + "/tlog")
        finally:
            ui.stop()
        assert r.returncode == 0 and f"size {size}" in r.stdout and "(1 timestamp(s) checked)" in r.stdout, r.stdout + r.stderr
        assert lp.terminate() == 0
    finally:
        lp.kill()
        tsa.stop()


def test_an_authority_down_never_stops_ingest_and_stamps_when_back(tmp_path, root, monkeypatch, caplog):
    tsa = LocalTSA(tmp_path / "tsa").start()
    tsa.stop()  # (its port is kept: it comes back there)
    monkeypatch.setenv(timestamps.TSA_ENV, tsa.url)
    monkeypatch.setenv(timestamps.TSA_CERTS_ENV, str(tsa.certs))
    monkeypatch.setenv(timestamping.EVERY_ENV, "0")
    monkeypatch.setattr(timestamping, "RETRY_S", 0.2)
    caplog.set_level(logging.INFO, logger="runledger.ledger.tlog.timestamping")
    ledger = service.Ledger(root)
    for k in range(3):  # three commits and checkpoints while it is down: each stored, logged and signed
        ledger.write(ledger.decode(batch_for([f"run-{k}"], 10, first_sseq=1 + 10 * k)))
        ledger.commit()
        ledger.tlog.sign()
        assert ledger.tlog.timestamping.wait_idle(WAIT_S)
    assert read_events(root, columns=["hash"]).num_rows == 30 and ledger.tlog.size == 30
    assert "unreachable" in ledger.tlog.timestamping.failing
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "did not stamp" in said[0] and "size 10" in said[0], said
    r = _audit_cli(root, tsa)
    assert r.returncode == 0 and "checkpoint size 30 has no timestamp" in r.stdout, r.stdout + r.stderr
    assert _audit_cli(root, tsa, "--require-timestamps").returncode == 1
    tsa.start()  # back: the newest checkpoint is stamped on the next retry, with no new event
    try:
        _wait_for(ledger.tlog.dir / timestamps.path_of(30), "timestamp after the authority came back")
        assert ledger.tlog.timestamping.stamped == [30]  # (only the newest: the older ones are covered by it)
        assert any("stamps" in r.getMessage() and "again" in r.getMessage() for r in caplog.records)
        r = _audit_cli(root, tsa, "--require-timestamps")
        assert r.returncode == 0 and "size 30" in r.stdout and "(1 timestamp(s) checked)" in r.stdout, r.stdout
    finally:
        tsa.stop()
