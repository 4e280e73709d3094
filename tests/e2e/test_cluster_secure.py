"""Access on a 3-node cluster: `nats up --cluster 3 --secure` gives every node the same roles, and the
permission tests of test_security.py hold against it, whichever node a client reaches."""

from __future__ import annotations

import asyncio
import itertools
import json

import nats
import pytest
from attacks import test_security
from nats.js.errors import NotFoundError

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.bus import natsserver
from runledger.ledger.settings import creds_dir, read_creds
from support.processes import LedgerProcess, cli

# The same checks, run here against the cluster (pytest gives them this module's `secure` fixture). The
# cluster is started once, so the stream keeps what earlier checks published and each check's fresh
# ledger root takes all of it: they run in this order, in which what one leaves is what the next
# expects (no events at first; then a worker's 20 steps and no decision; then the agent's decision).
test_the_ledger_and_readers_cannot_publish_events = test_security.test_the_ledger_and_readers_cannot_publish_events
test_a_wrong_password_is_refused = test_security.test_a_wrong_password_is_refused
test_a_worker_publishes_its_own_run_and_nothing_else = test_security.test_a_worker_publishes_its_own_run_and_nothing_else
test_an_agent_decides_but_cannot_write_steps = test_security.test_an_agent_decides_but_cannot_write_steps

NODES = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One secure 3-node cluster for the module (its start is most of a test's time)."""
    base = tmp_path_factory.mktemp("secure-cluster")
    up = cli("nats", "up", "--root", str(base), "--cluster", str(NODES), "--secure", "--runs", "r1")
    assert up.returncode == 0, up.stderr
    yield base
    natsserver.down(base)


@pytest.fixture
def secure(cluster, tmp_path):
    """What test_security's fixture gives (a ledger root, a folder of credentials), on the cluster: a
    fresh ledger root and consumer per test, and credentials that name one node each, round the nodes
    (so the checks reach every node, and plain `nats.connect` reads them)."""
    ledger_url = read_creds(creds_dir(cluster) / "ledger.creds")
    asyncio.run(_fresh_consumer(ledger_url))
    node = next(_NODE_TURN) % NODES
    creds = tmp_path / "creds"
    creds.mkdir()
    for f in creds_dir(cluster).glob("*.creds"):
        (creds / f.name).write_text(read_creds(f).split(",")[node] + "\n")
    root = tmp_path / "root"
    ledger = LedgerProcess(root, ledger_url, tmp_path / "ledger.log").start()
    yield root, creds
    ledger.kill()


_NODE_TURN = itertools.count()


KEEP = "tests-keep"  # a durable consumer that acks nothing: see _fresh_consumer


async def _fresh_consumer(url: str) -> None:
    """The last check's ledger consumer gone (the ledger role may delete it), for a fresh root; and the
    stream held whole for it: a ledger prunes what every durable consumer acked but the stream's last
    message (runledger.ledger.bus.retention), so without KEEP a check that leaves two messages (a worker's
    steps and, with signed heads on, its closing chain_head) would leave the next root a stream that
    begins past what it took, which it rightly refuses as purged."""
    nc = await bus.connect(url)
    js = nc.jetstream()
    try:
        await js.delete_consumer("RUNLEDGER", "ledger")
    except NotFoundError:
        pass
    try:
        await bus.ensure_consumer(js, KEEP)
    except NotFoundError:  # (no stream yet: the first check's ledger makes it, before any event)
        pass
    await nc.close()


def test_every_node_has_the_same_roles_and_the_stream_has_three_replicas(cluster):
    creds = creds_dir(cluster)
    layout = json.loads((natsserver.nats_dir(cluster) / natsserver.CLUSTER_FILE).read_text())
    assert len(layout["ports"]) == NODES
    worker_urls = read_creds(creds / "worker-r1.creds").split(",")
    assert len(worker_urls) == NODES  # one URL per node

    async def check() -> int:
        for node_url in worker_urls:  # each node alone: the worker's password works, a wrong one does not
            nc = await nats.connect(node_url, allow_reconnect=False, connect_timeout=2)
            await nc.close()
            with pytest.raises(Exception):
                await nats.connect(node_url.replace("@", "x@"), allow_reconnect=False, connect_timeout=2,
                                   max_reconnect_attempts=0)
        nc = await bus.connect(read_creds(creds / "ledger.creds"))
        info = await nc.jetstream().stream_info("RUNLEDGER")
        await nc.close()
        return info.config.num_replicas

    assert asyncio.run(check()) == NODES


def test_a_new_run_gets_credentials_on_every_node(cluster):
    creds = creds_dir(cluster)
    made = cli("nats", "creds", "--root", str(cluster), "--worker", "r9")
    assert made.returncode == 0, made.stderr
    urls = read_creds(creds / "worker-r9.creds").split(",")
    assert len(urls) == NODES

    async def connect_each() -> None:
        for node_url in urls:
            nc = await nats.connect(node_url, allow_reconnect=False, connect_timeout=2)
            await nc.close()

    asyncio.run(connect_each())
