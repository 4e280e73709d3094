"""A 3-node JetStream cluster (stream replicas 3): killing one node during ingest loses nothing."""

from __future__ import annotations

import asyncio
import time

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.bus.natsserver import cluster_url, start_cluster
from support.processes import LedgerProcess, cli, start_producer
from support.reading import reader, wait_for_count


async def _make_stream(url: str) -> int:
    deadline = time.monotonic() + 60
    while True:  # the cluster elects a JetStream leader first
        try:
            nc = await bus.connect(url)
            await bus.ensure_stream(nc.jetstream(), replicas=3)
            info = await nc.jetstream().stream_info("RUNLEDGER")
            await nc.close()
            return info.config.num_replicas
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


def test_killing_one_of_three_nodes_during_ingest_loses_nothing(tmp_path):
    nodes = start_cluster(tmp_path / "nats", 3)
    url = cluster_url(nodes)
    ledger = None
    try:
        assert asyncio.run(_make_stream(url)) == 3
        root = tmp_path / "root"
        ledger = LedgerProcess(root, url, tmp_path / "ledger.log").start()
        producer = start_producer(url, tmp_path / "spool", "clustered", "worker-0", 15_000, 3000)
        time.sleep(2.0)
        nodes[0].kill()  # the node both clients most likely connected to first
        assert producer.wait(240) == 0, producer.stderr.read()
        assert wait_for_count(root, "select count(*) from steps", 15_000, timeout=180) == 15_000
        assert reader(root).execute("select count(distinct event_id) from steps").fetchone()[0] == 15_000
        assert cli("verify", "--root", str(root)).returncode == 0
    finally:
        if ledger:
            ledger.kill()
        for n in nodes:
            n.stop()
