"""A secure server (`nats up --secure`) with workers for runs r1 and r2, and a ledger storing from it as
its own role: the fixture the role and attack tests share. `secure` gives (root, creds folder), the
shape tests/e2e/test_cluster_secure.py gives on a cluster; `secure_ledger` (root, role -> URL, the
ledger process) for the tests that watch the ledger survive what they publish."""

from __future__ import annotations

import asyncio

import pytest

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.bus import natsserver
from support.processes import LedgerProcess, wait_serving


def url(creds, name):
    return natsserver.read_creds(creds / f"{name}.creds")


@pytest.fixture
def secure_server(tmp_path):
    root = tmp_path / "root"
    natsserver.up(root, secure=True, runs=("r1", "r2"))
    creds = natsserver.nats_dir(root) / "creds"

    async def make_stream():  # the ledger's to make: no other role may
        nc = await bus.connect(url(creds, "ledger"), max_reconnect_attempts=0)
        await bus.ensure_stream(nc.jetstream())
        await nc.close()

    asyncio.run(make_stream())
    ledger = LedgerProcess(root, url(creds, "ledger"), tmp_path / "ledger.log").start()
    wait_serving(ledger)
    yield root, creds, ledger
    ledger.kill()
    natsserver.down(root)


@pytest.fixture
def secure(secure_server):
    root, creds, _ = secure_server
    return root, creds


@pytest.fixture
def secure_ledger(secure_server):
    root, creds, ledger = secure_server
    return root, {p.stem: natsserver.read_creds(p) for p in creds.glob("*.creds")}, ledger
