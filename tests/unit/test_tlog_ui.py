"""The dashboard serves the transparency log as tlog-tiles names it, to anyone: no token, no header,
static and bounded; a tile client reads the log over HTTP and the audit passes from that URL alone.
Nothing else under the root is reachable through those paths."""

from __future__ import annotations

import urllib.error
import urllib.request
from unittest import mock

from starlette.testclient import TestClient

from runledger.ledger.tlog import audit, note, tiles
from runledger.ledger.tlog import log as tlog
from runledger.ui.access import configure
from runledger.ui.app import create_app
from support.tables import write_batches
import pytest

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)


def _stored(root):
    write_batches(root, 3)
    lg = tlog.Log(root, signer=tlog.load_or_make_key())
    lg.open(tlog.stored_events(root))  # (write_batches commits behind the service: the log catches up)
    return lg


def test_tiles_and_checkpoint_are_public_reads(root):
    lg = _stored(root)
    app = create_app(root, None, configure("0.0.0.0", token="t" * 20))  # a dashboard that wants a token for its API
    with TestClient(app, base_url="http://203.0.113.5:8765") as c:
        assert c.get("/api/runs").status_code == 401  # the API still needs it
        r = c.get("/tlog/checkpoint")  # no token, no header
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert r.headers["access-control-allow-origin"] == "*" and "max-age=2" in r.headers["cache-control"]
        assert r.text == (root / "tlog/checkpoint").read_text()
        rel = tiles.tile_path(0, 0, lg.size)
        r = c.get(f"/tlog/{rel}")
        assert r.status_code == 200 and r.content == (root / "tlog" / rel).read_bytes()
        assert "immutable" in r.headers["cache-control"]
        for bad in ("/tlog/../catalog.db", "/tlog/tile/0/..%2F..%2Fcatalog.db", "/tlog/heads", "/tlog/tile/0/1",
                    "/tlog-state/log.json", "/tlog/tile/0/999"):
            assert c.get(bad).status_code == 404, bad


def test_the_audit_reads_the_log_over_http(root, tmp_path):
    _stored(root)
    app = create_app(root, None, configure("127.0.0.1"))
    vkey = note.read_key(tlog.key_file()).verifier
    with TestClient(app, base_url="http://127.0.0.1:8765") as c:
        class Resp:
            def __init__(self, r):
                self.r = r

            def read(self, n=-1):
                return self.r.content

            def __enter__(self):
                return self

            def __exit__(self, *a):
                return False

        def fetch(url, timeout=None):
            r = c.get(url.removeprefix("http://127.0.0.1:8765"))
            if r.status_code == 404:
                raise urllib.error.HTTPError(url, 404, "not found", None, None)
            return Resp(r)

        with mock.patch.object(urllib.request, "urlopen", fetch):
            done = audit.audit("http://127.0.0.1:8765/tlog", [vkey], root, seen=tmp_path / "seen")
    assert done.logs[0].size == done.events == 3 * 7


def test_an_events_proof_is_served_to_the_dashboard(root):
    from runledger.ledger.storage.reads import read_events
    from runledger.ledger.tlog import checkpoint

    _stored(root)
    env = read_events(root, columns=["event_id", "run_id", "producer", "attempt", "seq", "hash"]).to_pylist()[5]
    app = create_app(root, None, configure("127.0.0.1"))
    with TestClient(app, base_url="http://127.0.0.1:8765", headers={"x-requested-with": "runledger"}) as c:
        r = c.get(f"/api/tlog/proof/{env['event_id']}")
        assert r.status_code == 200, r.text
        cp = checkpoint.TlogProof.parse(r.text).verify(tlog.entry_of(env), [note.read_key(tlog.key_file()).verifier])
        assert cp.size == 21
        assert c.get("/api/tlog/proof/no-such-event").status_code == 404
