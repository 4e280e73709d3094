"""`runledger notify` and the stall alert: every alert and decision reaches its webhooks at least once,
through a receiver that fails, goes away and comes back, and a notify killed mid-delivery; a run
that pauses gets a `stalled` alert, then its resolution.

The receiver is a real HTTP server on a free loopback port that dedupes by the Idempotency-Key, as
the issue asks of receivers; NATS, the ledger and DuckDB are the real ones.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from pathlib import Path

import pytest

from runledger.agents.runner import run_agents
from runledger.interop.notify import serve
from runledger.interop.routes import Route
from runledger.ledger.bus import jetstream as bus
from runledger.ledger.bus import natsserver
from runledger.ledger.bus.natsserver import free_port
from runledger.ledger.emit.emitter import Emitter
from runledger.ledger.emit.sealing import seal
from support.reading import reader, wait_for_count
from support.webhooks import (
    Receiver,
    alert,
    decision,
    notify_process,
    publish_raw,
    receiver,  # noqa: F401 (fixtures)
)

STEP = {"loss": 2.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 64, "step_time_s": 0.05}
START = {"config": {}, "config_hash": "0" * 64, "token_budget": None}  # (replay reads token_budget as a key)
SEVERITIES = ("info", "warn", "fail")


# ------------------------------------------------------------------------------------ the receiver


def routes_file(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "routes.toml"
    path.write_text(f"""
[[route]]
name = "everything"
url = "http://127.0.0.1:{port}/json"

[[route]]
name = "oncall"
url = "http://127.0.0.1:{port}/slack"
format = "slack"
kinds = ["alert"]
severity = ["fail"]
""")
    return path


# ------------------------------------------------------------------------------------ delivery, live


def emit_alerts_and_decisions(url: str, spool: Path, run_id: str, n: int) -> tuple[set[str], set[str]]:
    """`n` alerts (severities in turn) and n/2 decisions from an agent: (every event id, the fail alerts')."""
    em = Emitter(run_id, "agent-test", 0, url, spool)
    every, failing = set(), set()
    for i in range(n):
        eid = em.emit_dict("alert", alert(i, SEVERITIES[i % 3]), step=i)
        every.add(eid)
        if SEVERITIES[i % 3] == "fail":
            failing.add(eid)
        if i % 2:
            every.add(em.emit_dict("decision", decision(i), step=i))
    assert em.close(timeout=30)
    return every, failing


def emit_steps(url: str, spool: Path, run_id: str, n: int) -> None:
    em = Emitter(run_id, "worker-0", 0, url, spool)
    em.emit_dict("run_started", START, step=0)
    for k in range(n):
        em.emit_dict("step", STEP, step=k)
    assert em.close(timeout=60)


def test_every_alert_and_decision_arrives_through_failures_an_outage_and_a_restart(
        tmp_path, nats_server, ledger_process, receiver):
    ledger_process.start()
    url, spool = nats_server.url, tmp_path / "spool"
    routes = routes_file(tmp_path, receiver.port)
    notify = notify_process(tmp_path, routes, url)
    try:
        # a receiver that fails its first tries with 500, then takes what comes
        every, failing = emit_alerts_and_decisions(url, spool, "r1", 12)
        forged, _ = seal("r1", "agent-forger", 0, 0, "alert", alert(99, "fail"), 0, "")
        forged["payload"]["message"] = "edited after sealing"  # its hash no longer matches: the ledger refuses it
        asyncio.run(publish_raw(url, "runledger.r1.alert", json.dumps(forged).encode()))
        assert receiver.wait_for("/json", every) == every

        # the receiver goes down: the ledger stores everything all the same, notify holds what it cannot deliver
        receiver.down()
        more, more_failing = emit_alerts_and_decisions(url, spool, "r2", 12)
        emit_steps(url, spool, "r2", 2000)
        every, failing = every | more, failing | more_failing
        assert wait_for_count(ledger_process.root, "select count(*) from steps", 2000) == 2000
        con = reader(ledger_process.root)
        assert con.execute("select count(*) from alerts").fetchone()[0] + \
            con.execute("select count(*) from decisions").fetchone()[0] == len(every)
        assert con.execute("select count(*) from quarantine").fetchone()[0] == 1  # the forged alert

        # notify is killed while it holds undelivered messages, and started again
        time.sleep(1.0)  # (it has taken them and is retrying)
        notify.send_signal(signal.SIGKILL)
        notify.wait()
        notify = notify_process(tmp_path, routes, url)
        time.sleep(1.0)

        # the receiver comes back: everything arrives, each event once after its dedupe
        receiver.up()
        assert receiver.wait_for("/json", every) == every
        assert receiver.wait_for("/slack", failing) == failing  # the on-call route: fail alerts only
        assert not receiver.mismatched
        assert forged["event_id"] not in receiver.keys("/json")
        assert all(set(b) == {"text", "blocks"} for b in receiver.kept["/slack"].values())
        assert all(b["event"]["event_id"] == k for k, b in receiver.kept["/json"].items())
        notify.send_signal(signal.SIGTERM)
        assert notify.wait(30) == 0
    finally:
        if notify.poll() is None:
            notify.kill()
            notify.wait()


def test_a_dead_route_holds_back_only_itself_and_its_messages_stay_unacked_in_progress(tmp_path, nats_server):
    receiver = Receiver().up()
    dead = free_port()  # nothing listens there: connections refused
    routes = [Route("dead", f"http://127.0.0.1:{dead}/x"), Route("live", f"http://127.0.0.1:{receiver.port}/json")]
    every, _ = emit_alerts_and_decisions(nats_server.url, tmp_path / "spool", "r1", 6)
    ack_wait_s = 1.5  # short, so that this test outlives it several times over

    async def deliver_for(seconds: float):
        stop = asyncio.Event()
        task = asyncio.create_task(serve(routes, nats_server.url, from_start=True, stop=stop, poll_s=0.2,
                                         ack_wait_s=ack_wait_s))
        await asyncio.sleep(seconds)
        nc = await bus.connect(nats_server.url)
        info = await nc.jetstream().consumer_info("RUNLEDGER", "notify")
        messages = (await nc.jetstream().stream_info("RUNLEDGER")).state.messages
        await nc.close()
        stop.set()
        await task
        return info, messages

    try:
        info, messages = asyncio.run(deliver_for(4 * ack_wait_s))
        assert receiver.keys("/json") == every  # the live route got everything while the other failed
        assert info.num_ack_pending == messages and info.ack_floor.stream_seq == 0  # all held, for the dead route
        assert info.num_redelivered == 0  # kept in progress: JetStream never gave them up
    finally:
        receiver.down()


class Background:
    """The agents runner (sweeping every `sweep_s`) and, given routes, notify: in one event loop on a thread
    of this process, until `stop()`."""

    def __init__(self, root: Path, url: str, routes: list[Route] = (), sweep_s: float = 0.5) -> None:
        self.loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()

        async def main():
            await asyncio.gather(run_agents(root, url, stop=self._stop, poll_s=0.25, sweep_s=sweep_s),
                                 *([serve(list(routes), url, from_start=True, stop=self._stop, poll_s=0.25)]
                                   if routes else []))

        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(main(),), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(30)


def test_a_run_that_pauses_gets_a_stall_alert_and_its_resolution(tmp_path, nats_server, ledger_process):
    receiver = Receiver().up()
    ledger_process.start()
    root, url = ledger_process.root, nats_server.url
    routes = [Route("stalls", f"http://127.0.0.1:{receiver.port}/json", kinds=("alert",))]
    em = Emitter("p", "worker-0", 0, url, tmp_path / "spool")
    em.emit_dict("run_started", {**START, "thresholds": {"stall_factor": 3.0, "stall_min_s": 1.5}}, step=0)
    bg = Background(root, url, routes)
    try:
        for k in range(20):  # steps in a burst (a loaded machine's pauses are not a stall), then a pause: no
            em.emit_dict("step", STEP, step=k)  # event wakes the agents, their sweep does
        stalled = "select count(*) from alerts where rule = 'stalled' and state = '{}'"
        assert wait_for_count(root, stalled.format("open"), 1, timeout=30) == 1
        for k in range(20, 25):  # steps come back
            em.emit_dict("step", STEP, step=k)
        assert wait_for_count(root, stalled.format("resolved"), 1, timeout=30) == 1
        em.emit_dict("run_finished", {"status": "completed"}, step=24)
        assert em.close(timeout=30)
        deadline = time.monotonic() + 30

        def stall_alerts():  # (the health agent may say the same pause another way: telemetry_gone)
            got = (receiver.kept["/json"][k]["event"]["payload"] for k in receiver.order.get("/json", []))
            return [p for p in got if p["rule"] == "stalled"]

        while len(stall_alerts()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        opened, resolved = stall_alerts()[:2]
        assert (opened["rule"], opened["state"], resolved["state"]) == ("stalled", "open", "resolved")
        assert opened["alert_id"] == resolved["alert_id"]  # the resolution names the alert it closes
        stored = reader(root).execute("select alert_id, state from alerts").fetchall()
        assert (opened["alert_id"], "open") in stored and (opened["alert_id"], "resolved") in stored
        assert len(stored) == len(set(stored))  # once each
    finally:
        bg.stop()
        receiver.down()


# ------------------------------------------------------------------------------------ the notify role


def test_the_notify_role_consumes_its_own_consumer_and_nothing_else(tmp_path):
    root = tmp_path / "root"
    natsserver.up(root, secure=True, runs=("r1",))
    creds = natsserver.nats_dir(root) / "creds"
    try:
        async def attempt():
            ledger_nc = await bus.connect(natsserver.read_creds(creds / "ledger.creds"))
            await bus.ensure_stream(ledger_nc.jetstream())
            await bus.ensure_consumer(ledger_nc.jetstream(), "ledger")
            await ledger_nc.close()
            errors: list[str] = []

            async def on_error(err):
                errors.append(str(err))

            nc = await bus.connect(natsserver.read_creds(creds / "notify.creds"), error_cb=on_error)
            js = nc.jetstream()
            from runledger.interop.notify import ensure_consumer as notify_consumer

            await notify_consumer(js, "notify", from_start=True)  # its own: allowed, and it reads alerts through it
            agent_nc = await bus.connect(natsserver.read_creds(creds / "agent.creds"))
            env, text = seal("r1", "agent-test", 0, 0, "alert", alert(0, "fail"), 0, "")
            await agent_nc.jetstream().publish("runledger.r1.alert", text.encode())
            await agent_nc.close()
            [msg] = await (await bus.Puller(nc, "RUNLEDGER", "notify").start()).fetch(10, timeout=5)
            assert json.loads(msg.data)["event_id"] == env["event_id"]
            await msg.in_progress()
            await msg.ack_sync()
            assert (await js.consumer_info("RUNLEDGER", "notify")).ack_floor.stream_seq == 1
            with pytest.raises(Exception):  # the ledger's consumer: neither read nor deleted
                await js.consumer_info("RUNLEDGER", "ledger", timeout=2)
            with pytest.raises(Exception):
                await js.delete_consumer("RUNLEDGER", "ledger", timeout=2)
            with pytest.raises(Exception):
                await js.publish("runledger.r1.alert", b"{}", timeout=2)  # nor publish an event
            await nc.close()
            return errors

        errors = asyncio.run(attempt())
        assert any("permissions violation" in e.lower() for e in errors), errors
    finally:
        natsserver.down(root)
