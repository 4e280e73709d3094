"""Access: with `nats up --secure`, each role can publish only what it should; refusals are reported.

A worker publishes its own run's worker kinds and nothing else; an agent only decisions and alerts;
the ledger only consumes; a reader has nothing on NATS. What the server refuses stays in the
producer's spool and is reported (Emitter.refused, an ERROR log, close() returning False).
"""

from __future__ import annotations

import asyncio
import json
import logging

import nats
import pytest

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.bus import natsserver
from runledger.ledger.contract.events import subject_for
from runledger.ledger.emit.emitter import Emitter
from runledger.ledger.emit.sealing import seal
from support.processes import LedgerProcess
from support.reading import reader, wait_for_count
from support.secure import secure, secure_ledger, secure_server, url  # noqa: F401 (fixtures)

STEP = {"loss": 2.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 64, "step_time_s": 0.1}
DECISION = {"decision_id": "d1", "agent": "rogue", "rule": "none", "action": "checkpoint_now", "rationale": "test"}


def test_a_worker_publishes_its_own_run_and_nothing_else(secure, tmp_path, caplog):
    root, creds = secure
    em = Emitter("r1", "worker-0", 0, url(creds, "worker-r1"), tmp_path / "spool")
    for s in range(20):
        em.emit_dict("step", STEP, step=s)
    assert em.flush(30)
    with caplog.at_level(logging.ERROR, logger="runledger.ledger.emit.emitter"):
        em.emit_dict("decision", DECISION, step=19)  # not a worker kind
        assert not em.close(timeout=8)  # never acknowledged ...
    assert "runledger.r1.decision" in em.refused  # ... because refused, and said so
    assert any("NATS refused runledger.r1.decision" in r.message for r in caplog.records)
    spooled = (tmp_path / "spool" / "r1" / "worker-0" / "0").glob("seg-*.jsonl")
    assert any(b'"kind":"decision"' in f.read_bytes() for f in spooled)  # kept, not lost

    other = Emitter("r2", "worker-0", 0, url(creds, "worker-r1"), tmp_path / "spool")
    other.emit_dict("step", STEP, step=0)  # another run's events
    assert not other.close(timeout=8)
    assert "runledger.r2.step" in other.refused

    assert wait_for_count(root, "select count(*) from steps", 20) == 20
    con = reader(root)
    assert con.execute("select count(*) from decisions").fetchone()[0] == 0
    assert con.execute("select count(*) from steps where run_id = 'r2'").fetchone()[0] == 0


def test_an_agent_decides_but_cannot_write_steps(secure, tmp_path):
    root, creds = secure
    em = Emitter("r1", "agent-test", 0, url(creds, "agent"), tmp_path / "spool")
    em.emit_dict("decision", DECISION, step=None)
    assert em.flush(30)
    em.emit_dict("step", STEP, step=0)
    assert not em.close(timeout=8)
    assert em.refused == {"runledger.r1.step"}
    assert wait_for_count(root, "select count(*) from decisions", 1) == 1


@pytest.mark.parametrize("role", ["ledger", "reader"])
def test_the_ledger_and_readers_cannot_publish_events(secure, role):
    root, creds = secure
    errors: list[str] = []

    async def try_publish():
        async def on_error(err):
            errors.append(str(err))

        nc = await nats.connect(url(creds, role), error_cb=on_error)
        env, text = seal("r1", "worker-0", 9, 0, "step", STEP, 0, "")
        with pytest.raises(Exception):  # no PubAck: the server refused the publish
            await nc.jetstream().publish(subject_for("r1", "step"), text.encode(), timeout=2)
        await nc.close()

    asyncio.run(try_publish())
    assert any("permissions violation for publish" in e.lower() for e in errors), errors
    assert reader(root).execute("select count(*) from events").fetchone()[0] == 0


def test_a_wrong_password_is_refused(secure):
    root, creds = secure
    bad = url(creds, "worker-r1").replace("@", "x@")

    async def connect():
        await nats.connect(bad, max_reconnect_attempts=0, connect_timeout=2, allow_reconnect=False)

    with pytest.raises(Exception):
        asyncio.run(connect())


def test_a_partitioned_ledger_serves_a_secure_server_and_no_other_role_reaches_its_stream_or_leases(tmp_path):
    """`ledger serve --partitions 2` with the ledger's credentials: it makes its derived stream and lease
    bucket and stores every run's events. A worker and an agent then try to take a partition's lease,
    read or delete the derived stream, or consume from it: each is refused, and the ledger goes on
    storing every event exactly once."""
    root = tmp_path / "root"
    natsserver.up(root, secure=True, runs=("r1", "r2"))
    creds = natsserver.nats_dir(root) / "creds"
    ledger = LedgerProcess(root, url(creds, "ledger"), tmp_path / "ledger.log", "--partitions", "2").start()
    try:
        def emit(run: str, steps: range) -> None:
            em = Emitter(run, "worker-0", 0, url(creds, f"worker-{run}"), tmp_path / "spool")  # (the spool's chain goes on)
            for s in steps:
                em.emit_dict("step", STEP, step=s)
            assert em.close(timeout=60), em.refused

        emit("r1", range(0, 40))
        emit("r2", range(0, 40))
        assert wait_for_count(root, "select count(*) from steps_all", 80) == 80

        for role in ("worker-r1", "agent"):
            errors: list[str] = []

            async def attack():
                async def on_error(err):
                    errors.append(str(err).lower())

                nc = await nats.connect(url(creds, role), error_cb=on_error)
                for subject, body in (("$KV.runledger-leases-k2.p0", b'{"holder": "rogue"}'),  # take a lease
                                      ("$JS.API.STREAM.DELETE.RUNLEDGER_P2", b""),
                                      ("$JS.API.STREAM.PURGE.RUNLEDGER_P2", b""),
                                      ("$JS.API.STREAM.INFO.RUNLEDGER_P2", b""),
                                      ("$JS.API.CONSUMER.CREATE.RUNLEDGER_P2", b'{"stream_name": "RUNLEDGER_P2"}')):
                    with pytest.raises(Exception):  # no reply: the server refused the publish
                        await nc.request(subject, body, timeout=1)
                await nc.close()

            asyncio.run(attack())
            assert sum("permissions violation for publish" in e for e in errors) == 5, (role, errors)

        async def streams_and_leases():
            nc = await bus.connect(url(creds, "ledger"))
            js = nc.jetstream()
            info = await js.stream_info("RUNLEDGER_P2")
            kv = await js.key_value("runledger-leases-k2")
            holders = {json.loads((await kv.get(f"p{p}")).value)["holder"] for p in (0, 1)}
            await nc.close()
            return info, holders

        info, holders = asyncio.run(streams_and_leases())
        assert all("rogue" not in h for h in holders), holders
        emit("r1", range(40, 60))  # the ledger goes on, exactly once
        assert wait_for_count(root, "select count(*) from steps_all", 100) == 100
        con = reader(root)
        assert con.execute("select count(distinct event_id), count(*) from events where kind = 'step'").fetchone() == (100, 100)
    finally:
        ledger.kill()
        natsserver.down(root)


def test_the_ledger_lets_go_of_acked_messages_and_no_other_role_may_purge_the_stream(secure_ledger, tmp_path):
    """With its own credentials the ledger purges what every durable consumer acked (all but the stream's
    last message); a worker, an agent, notify and a reader asking the same purge are refused."""
    import time

    root, urls, ledger = secure_ledger
    em = Emitter("r1", "worker-0", 0, urls["worker-r1"], tmp_path / "spool")
    for step in range(3):
        em.emit_dict("step", STEP, step=step)
        assert em.flush(30)  # (a message each)
    assert em.close(timeout=60)
    sent = em.published  # (the 3 steps, and the chain head the worker signed at close: a message each)

    async def state():
        nc = await bus.connect(urls["ledger"], max_reconnect_attempts=0)
        info = await nc.jetstream().stream_info("RUNLEDGER")
        await nc.close()
        return info.state

    deadline = time.monotonic() + 60
    while (s := asyncio.run(state())).messages > 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sent >= 3 and (s.first_seq, s.last_seq, s.messages) == (sent, sent, 1), s
    assert b"cannot let go" not in ledger.log_path.read_bytes()

    for role in ("worker-r1", "agent", "notify", "reader"):
        errors: list[str] = []

        async def purge():
            async def on_error(err):
                errors.append(str(err).lower())

            nc = await nats.connect(urls[role], error_cb=on_error)
            with pytest.raises(Exception):  # no reply: the server refused the publish
                await nc.request("$JS.API.STREAM.PURGE.RUNLEDGER", b"{}", timeout=1)
            await nc.close()

        asyncio.run(purge())
        assert any("permissions violation for publish" in e for e in errors), (role, errors)
    assert asyncio.run(state()).messages == 1
    assert reader(root).execute("select count(*) from steps_all").fetchone()[0] == 3
