"""The ledger's pull (`runledger.ledger.bus.jetstream.Puller`) against a real nats-server."""

from __future__ import annotations

import asyncio

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.contract.events import STREAM, subject_for


def test_a_backlog_larger_than_a_subscription_may_hold_comes_without_a_stall(nats_server):
    """96 MB waiting (a ledger catching up): each pull brings at most PULL_MAX_BYTES, so nats-py never
    drops messages as a slow consumer's (64 MiB per subscription), which JetStream would deliver
    again only after ack_wait; every fetch until the last message brings messages, none comes back empty."""
    n, size = 100, 960 << 10

    async def go() -> list[int]:
        nc = await bus.connect(nats_server.url)
        js = nc.jetstream()
        await bus.ensure_stream(js)
        for i in range(n):
            await js.publish(subject_for("big", "step"), bytes([i]) * size)
        await bus.ensure_consumer(js, "backlog")
        puller = await bus.Puller(nc, STREAM, "backlog").start()
        got = []
        while len(got) < n:
            msgs = await puller.fetch(2_000, timeout=5.0)
            assert msgs, f"a fetch came back empty after {len(got)} of {n} messages"
            assert sum(len(m.data) for m in msgs) <= bus.PULL_MAX_BYTES
            got += [m.data[0] for m in msgs]
            for m in msgs:
                await m.ack()
        await nc.close()
        return got

    assert asyncio.run(go()) == list(range(n))
