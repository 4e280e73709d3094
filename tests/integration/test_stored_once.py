"""Every value is stored once at rest: once the ledger's tables hold a run, its spool lines go, and the
stream lets go of a message once every durable consumer (the ledger, notify, the agents) has acked it,
and not before; a producer killed between the ledger's store and its spool's prune loses and doubles
nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import nats
import pytest

import runledger
from runledger.ledger import settings
from runledger.ledger.bus import retention
from runledger.ledger.contract.events import STREAM
from support import REPO
from support.processes import verify, wait_serving
from support.reading import reader

WATCHDOG_S = 60


def segments(client_root, run_id: str) -> list:
    return sorted(settings.spool_dir(client_root).glob(f"{run_id}/*/*/seg-*.jsonl"))


def test_a_finished_run_the_ledger_stored_leaves_no_spool_lines(ledger_process, nats_server, root, tmp_path, monkeypatch):
    ledger_process.start()
    wait_serving(ledger_process)  # (else init may find no ledger yet, and finish's True is JetStream's alone)
    monkeypatch.setenv("RUNLEDGER_NATS", nats_server.url)
    monkeypatch.setenv("RUNLEDGER_ROOT", str(tmp_path / "client"))  # the client's spool; the ledger's root is `root`
    run = runledger.init(project="p", id="pruned", system_metrics=False)
    for step in range(300):
        runledger.log({"loss": 1.0 / (step + 1), "lr": 0.1})
        assert step > 0 or segments(tmp_path / "client", "pruned")  # (spooled before log returned)
    assert run.finish()
    assert reader(root).execute("select count(*) from metrics where run_id = 'pruned'").fetchall() == [(600,)]
    assert segments(tmp_path / "client", "pruned") == []
    chain = next(settings.spool_dir(tmp_path / "client").glob("pruned/*/0"))
    assert sum(f.stat().st_size for f in chain.rglob("*") if f.is_file()) < 200  # `stored`, `acked`, `lock`

    again = runledger.init(project="p", id="pruned", resume=True, system_metrics=False)  # the run goes on
    assert again.attempt == 1
    runledger.log({"loss": 0.5})
    assert again.finish()
    assert segments(tmp_path / "client", "pruned") == []
    assert verify(root)[0] == 0


async def stream_state(url: str):
    nc = await nats.connect(url)
    try:
        return (await nc.jetstream().stream_info(STREAM)).state
    finally:
        await nc.close()


def test_the_stream_keeps_a_message_until_every_durable_consumer_acked_it(ledger_process, nats_server, root, tmp_path,
                                                                           monkeypatch):
    """A notify whose durable exists but is stopped keeps the run's messages in the stream (it would
    deliver the run's alerts when started late); once it acks them, the ledger lets them go, all but the
    stream's last message."""
    from runledger.interop.notify import ensure_consumer
    from runledger.ledger.bus.natsserver import NOTIFY_DURABLE

    async def make_notify() -> None:
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        from runledger.ledger.bus.jetstream import ensure_stream

        await ensure_stream(js)
        await ensure_consumer(js, NOTIFY_DURABLE, from_start=True)
        await nc.close()

    asyncio.run(make_notify())
    ledger_process.start()
    wait_serving(ledger_process)  # (else init may find no ledger yet, and finish's True is JetStream's alone)
    monkeypatch.setenv("RUNLEDGER_NATS", nats_server.url)
    monkeypatch.setenv("RUNLEDGER_ROOT", str(tmp_path / "client"))
    run = runledger.init(project="p", id="kept", system_metrics=False)
    for step in range(200):
        runledger.log({"loss": 1.0 / (step + 1)})
    run.alert("loss", "a late notify still sends this")
    assert run.finish()  # the ledger has stored and acked every message
    time.sleep(retention.PRUNE_EVERY_S * 3)  # (its prunes meanwhile may let go of none: notify acked none)
    state = asyncio.run(stream_state(nats_server.url))
    assert state.first_seq == 1 and state.messages == state.last_seq > 2

    async def notify_acks_everything() -> int:
        nc = await nats.connect(nats_server.url)
        sub = await nc.jetstream().pull_subscribe_bind(durable=NOTIFY_DURABLE, stream=STREAM)
        alerts = 0
        while True:
            try:
                msgs = await sub.fetch(100, timeout=2)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):  # (nats-py raises either when none came)
                break
            for m in msgs:
                alerts += m.subject.endswith(".alert")
                await m.ack_sync()
        await nc.close()
        return alerts

    assert asyncio.run(notify_acks_everything()) == 1  # the late notify got the run's alert
    deadline = time.monotonic() + WATCHDOG_S
    while (state := asyncio.run(stream_state(nats_server.url))).messages > 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (state.messages, state.first_seq) == (1, state.last_seq)  # all but the last, kept as a tripwire
    assert ledger_process.proc.poll() is None  # the ledger's own prune is no purge to stop for
    assert reader(root).execute("select count(*) from metrics where run_id = 'kept'").fetchall() == [(200,)]
    assert verify(root)[0] == 0


KILLED_IN_PRUNE = """
    import os, signal, sys
    import runledger
    from runledger.ledger.emit import spool

    prune = spool.Spool.prune
    def killed(self):
        if sys.argv[1] == "after-stored":  # killed once `stored` is written, before any segment is removed
            spool.fsync_dir = lambda d: os.kill(os.getpid(), signal.SIGKILL)
            prune(self)
        os.kill(os.getpid(), signal.SIGKILL)  # killed once the ledger said it stored the chain, before the prune
    spool.Spool.prune = killed

    run = runledger.init(project="p", id="killed", system_metrics=False)
    for step in range(500):
        runledger.log({"loss": 1.0 / (step + 1)})
    run.finish(wait=True)  # (the producer's own prune, once the ledger confirmed: the path finish(wait=True) takes)
    print("not killed")
"""


@pytest.mark.parametrize("when", ["before-stored", "after-stored"])
def test_a_producer_killed_between_the_ledgers_store_and_its_prune_loses_and_doubles_nothing(local_root, when):
    """On the embedded default: the script is SIGKILLed once the ledger said it stored the run, before
    its prune or midway (`stored` written, no segment removed). Resumed, the run is stored once, and the
    root's supervisor lets go of every spool line the ledger holds (emitter.prune_stored)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RUNLEDGER_NATS", "RUNLEDGER_CREDS")}
    env.update(RUNLEDGER_ROOT=str(local_root), PYTHONPATH=str(REPO))
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(KILLED_IN_PRUNE), when], env=env, capture_output=True,
                           text=True, timeout=WATCHDOG_S * 3)
    assert child.returncode == -signal.SIGKILL, (child.returncode, child.stdout, child.stderr[-2000:])
    assert segments(local_root, "killed")  # the kill left the spool's lines

    resume = """
        import runledger
        run = runledger.init(project="p", id="killed", resume=True, system_metrics=False)  # sends what was left
        for step in range(100):
            runledger.log({"loss": 0.5})
        assert run.finish()
    """
    again = subprocess.run([sys.executable, "-c", textwrap.dedent(resume)], env=env, capture_output=True, text=True,
                           timeout=WATCHDOG_S * 3)
    assert again.returncode == 0, again.stderr[-2000:]
    deadline = time.monotonic() + WATCHDOG_S
    while segments(local_root, "killed") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert segments(local_root, "killed") == []
    counts = reader(local_root).execute("select attempt, count(*), count(distinct step) from metrics_all "
                                        "where run_id = 'killed' and key = 'loss' group by attempt order by attempt").fetchall()
    assert counts[0] == (0, 500, 500) and counts[1][1:] == (100, 100)
    kinds = reader(local_root).execute("select kind, count(*), count(distinct event_id) from events "
                                       "where run_id = 'killed' group by kind").fetchall()
    assert all(n == distinct for _, n, distinct in kinds) and dict((k, n) for k, n, _ in kinds)["run_finished"] == 2
    assert not list(local_root.glob("spool/killed/*/*/damaged"))
    assert verify(local_root)[0] == 0
