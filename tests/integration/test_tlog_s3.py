"""The transparency log beside the tables on object storage, against a real S3 server (OpenStack Swift,
tests/support/s3.py; skipped when it is not installed): with `--warehouse s3://...` the tiles, entry
bundles and checkpoint go to the bucket and the private signing state stays in the root; a restarted
ledger resumes the log from the bucket; the dashboard serves it from there; `runledger tlog audit --log
s3://...` (a child process with no AWS_* variable: the root's credentials file) passes on what the
ledger wrote and fails on an edited tile."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from starlette.testclient import TestClient

from runledger.ledger.ingest import service
from runledger.ledger.storage import objects, store
from runledger.ledger.tlog import log as tlog
from runledger.ledger.tlog import note
from runledger.ui.access import configure
from runledger.ui.app import create_app
from support import REPO, s3
from support.batches import batch_for

pytestmark = pytest.mark.skipif(not s3.available(), reason="no Swift for the S3 tests: `make s3` installs it")


@pytest.fixture(scope="module")
def object_store():
    server = s3.SwiftS3().start()
    yield server
    server.stop()


def _ledger_on(root) -> service.Ledger:
    store.forget_tables(root)
    ledger = service.Ledger(root)
    ledger.stream_id = "RUNLEDGER@test"
    return ledger


def _kept(ledger: service.Ledger, msgs) -> None:
    ledger.write(ledger.decode(msgs))
    ledger.note_taken(msgs[-1][2])
    ledger.commit()


def _audit_child(root, log_uri: str, seen) -> subprocess.CompletedProcess:
    vkey = note.read_key(tlog.key_file()).verifier.text()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return subprocess.run([sys.executable, "-m", "runledger.tools.cli", "tlog", "audit", "--log", log_uri, "--vkey", vkey,
                           "--events", str(root), "--state", str(seen)],
                          cwd=REPO, capture_output=True, text=True, timeout=180, env=env)


def test_the_log_lives_in_the_bucket_and_its_audit_reads_it_there(object_store, root, tmp_path, monkeypatch):
    for k, v in object_store.credentials().items():
        monkeypatch.setenv(k, v)
    warehouse = f"s3://{object_store.bucket(f'tlog-{uuid.uuid4().hex[:12]}')}/tables"
    objects.use_warehouse(root, warehouse)
    msgs = batch_for(["run-1", "run-2"], 20)
    ledger = _ledger_on(root)
    _kept(ledger, msgs[:25])
    ledger.tlog.sign()
    log_uri = f"{warehouse}/tlog"
    assert str(ledger.tlog.dir) == log_uri
    assert objects.ObjectPath(log_uri + "/checkpoint").read_text().splitlines()[1] == "25"
    assert objects.ObjectPath(log_uri + "/tile/entries/000.p/25").exists()
    assert not (root / "tlog").exists()  # (no public file under the root)
    assert (root / tlog.STATE_DIR / "log.json").exists()  # the signing state stays local

    with monkeypatch.context() as m:  # restarted: the log resumed from the bucket's tiles, no stored event read
        m.setattr(tlog, "stored_events", None)
        again = _ledger_on(root)
    assert again.tlog.size == 25
    _kept(again, msgs[25:])
    again.tlog.sign()
    done = _audit_child(root, log_uri, tmp_path / "seen")
    assert done.returncode == 0 and "ok: 40 events" in done.stdout, done.stdout + done.stderr[-2000:]
    assert s3.SECRET_KEY not in done.stdout + done.stderr

    app = create_app(root, None, configure("127.0.0.1"))  # the dashboard serves the bucket's log to anyone
    with TestClient(app, base_url="http://127.0.0.1:8765") as c:
        for rel in ("checkpoint", "tile/0/000.p/40", "tile/entries/000.p/40"):
            r = c.get(f"/tlog/{rel}")
            assert r.status_code == 200 and r.content == objects.ObjectPath(f"{log_uri}/{rel}").read_bytes(), rel
        assert c.get("/tlog/tile/0/001").status_code == 404

    tile = objects.ObjectPath(log_uri + "/tile/0/000.p/40")
    tile.write_bytes(bytes(32) + tile.read_bytes()[32:])  # one hash of the bucket's tile edited
    done = _audit_child(root, log_uri, tmp_path / "seen")
    assert done.returncode == 1 and "tiles do not give" in done.stdout, done.stdout + done.stderr[-2000:]
    store.forget_tables(root)
