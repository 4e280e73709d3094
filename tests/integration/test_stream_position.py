"""The stream position in the commit, against a real nats-server: a restarted ledger reads its place
from the tables' commit and skips what is redelivered at or below it (no dedupe lookup); a stream
deleted and made anew (the spools replayed into it) is refused with one line, and once adopted by
`runledger ledger adopt-stream`, nothing is lost or stored twice."""

from __future__ import annotations

import asyncio

import nats
import pytest

from runledger.ledger.ingest import service
from runledger.ledger.storage import store, streampos
from runledger.ledger.contract.events import STREAM
from support.batches import batch_for
from support.processes import cli, verify
from support.reading import reader


async def publish_into_stream(url: str, msgs) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    from runledger.ledger.bus.jetstream import ensure_stream

    await ensure_stream(js)
    for subject, data, _ in msgs:
        await js.publish(subject, data)
    await nc.close()


async def serve_until(root, url: str, done, ledger=None) -> service.Counters:
    """Serve `root` until `done(counters)`; returns the counters."""
    ledger = ledger or service.Ledger(root)
    stop = asyncio.Event()
    task = asyncio.create_task(service.serve_ledger(ledger, url, stop))
    for _ in range(600):
        await asyncio.sleep(0.05)
        if done(ledger.counters) or task.done():
            break
    stop.set()
    await asyncio.wait_for(task, 30)
    return ledger.counters


def counts(root) -> tuple[int, int]:
    return reader(root).execute("select count(*), count(distinct event_id) from steps").fetchone()


def test_a_restart_skips_what_the_commit_holds_and_a_new_stream_is_refused_then_adopted(nats_server, root, monkeypatch):
    url = nats_server.url
    msgs = batch_for(["run-a", "run-b"], 50)
    asyncio.run(publish_into_stream(url, msgs))

    # stored and committed, never acked (the ledger died after its commit): all redelivered at the restart
    async def no_ack(self, *args, **kwargs):
        return None

    with monkeypatch.context() as m:
        m.setattr("nats.aio.msg.Msg.ack", no_ack)
        first = asyncio.run(serve_until(root, url, lambda c: c.stored >= 100))
    assert first.stored == 100
    store.forget_tables(root)
    at = streampos.read(store.tables_of(root))
    assert at.seq("ledger") == 100 and at.stream.startswith(f"{STREAM}@")

    (root / "ledger.position").unlink()  # (the place comes from the commit alone)
    again = service.Ledger(root)
    assert again.taken_upto == 100
    second = asyncio.run(serve_until(root, url, lambda c: c.messages >= 100, again))
    assert (second.skipped, second.stored, second.duplicates) == (100, 0, 0)
    assert again.index.loaded == set()  # no dedupe lookup for any of them
    assert counts(root) == (100, 100)

    # the stream deleted and made anew; the producers' spools replay into it, and 20 new events come
    async def recreate() -> None:
        nc = await nats.connect(url)
        await nc.jetstream().delete_stream(STREAM)
        await nc.close()

    asyncio.run(recreate())
    more = batch_for(["run-a", "run-b", "run-c"], 50)
    asyncio.run(publish_into_stream(url, [*msgs, *more[100:120]]))
    store.forget_tables(root)
    with pytest.raises(service.StreamLost) as refused:
        asyncio.run(service.serve(root, url, asyncio.Event()))
    line = str(refused.value)
    assert "is not the one root" in line and "adopt-stream" in line and "\n" not in line
    assert counts(root) == (100, 100)  # nothing taken from it

    r = cli("ledger", "adopt-stream", "--root", str(root), "--nats", url)
    assert r.returncode == 0 and "adopted stream" in r.stdout, r.stderr
    assert not (root / service.HALTED).exists()
    store.forget_tables(root)
    third = asyncio.run(serve_until(root, url, lambda c: c.messages >= 120))
    assert (third.stored, third.duplicates, third.skipped) == (20, 100, 0)
    assert counts(root) == (120, 120)
    assert verify(root)[0] == 0
    store.forget_tables(root)
    assert service.Ledger(root).taken_upto == 120  # the new stream's place, from the commit
    assert cli("ledger", "adopt-stream", "--root", str(root), "--nats", url).stdout.startswith(f"root {root} already")


def test_deliveries_lost_mid_pull_are_stored_once_they_come_again(nats_server, root, monkeypatch):
    """A pull's messages lost on the way (a cluster node killed mid-fetch): the server counts them as
    delivered and redelivers them after ack_wait, below what the ledger wrote meanwhile, where its
    position would skip them. The ledger sees its consumer's count jump, writes nothing past the gap,
    and makes the consumer again from its position: every event stored once."""
    from runledger.ledger.bus import jetstream

    monkeypatch.setattr(jetstream, "ACK_WAIT_S", 2.0)  # (so that a skip, were there one, would show in the test)
    url = nats_server.url
    asyncio.run(publish_into_stream(url, batch_for(["run-a", "run-b"], 150)))
    fetch, pulls = jetstream.Puller.fetch, []

    async def losing_the_second_pull(self, batch, timeout):
        msgs = await fetch(self, batch, timeout)
        if msgs:
            pulls.append(len(msgs))
            if len(pulls) == 2:
                return []  # delivered by the server, never seen by the ledger
        return msgs

    monkeypatch.setattr(jetstream.Puller, "fetch", losing_the_second_pull)
    ledger = service.Ledger(root)
    stop = asyncio.Event()

    async def run() -> None:
        task = asyncio.create_task(service.serve_ledger(ledger, url, stop, batch=50))
        for _ in range(200):  # (past ack_wait: a skipped redelivery would have come by then)
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, 30)

    asyncio.run(run())
    assert len(pulls) > 2 and pulls[1] == 50  # (the second pull did bring messages, lost)
    assert ledger.counters.stored == 300
    assert counts(root) == (300, 300)
    assert verify(root)[0] == 0
