"""Attacks by one role on another on a secure server: reading others' replies, forging others' alerts.

The promises: a role receives only its own replies (a worker, an agent or notify that subscribes to
everyone's inbox, or to the ledger's, is refused by the server and reads nothing while the ledger pulls
another run's events); an alert speaks only for its producer (its `agent` is its producer, a worker's
kind never carries an agent's or a person's name), and an alert is resolved only by the producer that
raised it or by a person, in the ledger's views, in replay and in notify's routes. What stays forgeable
(an alert under an agent's name on the worker's own run, agent == producer) is named in
test_what_a_worker_can_still_say_is_confined_to_its_own_run.
"""

from __future__ import annotations

import asyncio
import json

import nats
import pytest

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.bus import natsserver
from runledger.ledger.check.replay import replay, run_events
from runledger.ledger.emit.chains import ledger_attempts
from runledger.ledger.emit.emitter import Emitter
from support.reading import reader, wait_for_count
from support.secure import secure, secure_server, url  # noqa: F401 (fixtures)

STEP = {"loss": 2.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 64, "step_time_s": 0.1}
WATCH_S = 3.0  # how long an attacker's subscription listens while the ledger pulls events


async def snoop(attacker_url: str, subjects: list[str], while_running) -> tuple[list[str], list[str]]:
    """Subscribe as the attacker to `subjects` while `while_running()` (a coroutine) runs and a little
    after: (the subjects of what it received, the server's errors)."""
    got: list[str] = []
    errors: list[str] = []

    async def on_error(err):
        errors.append(str(err))

    async def on_msg(msg):
        got.append(msg.subject)

    nc = await nats.connect(attacker_url, error_cb=on_error, max_reconnect_attempts=0)
    for s in subjects:
        await nc.subscribe(s, cb=on_msg)
    await nc.flush()
    await while_running()
    await asyncio.sleep(WATCH_S)
    await nc.close()
    return got, errors


@pytest.mark.parametrize("attacker", ["worker-r1", "agent", "notify"])
def test_no_role_reads_the_ledgers_pulls_or_anyone_elses_replies(secure, tmp_path, attacker):
    root, creds = secure

    async def run_r2_emits():
        em = Emitter("r2", "worker-0", 0, url(creds, "worker-r2"), tmp_path / "spool")
        for s in range(20):
            em.emit_dict("step", STEP, step=s)
        assert await asyncio.to_thread(em.close, 30)

    snooped = ["_INBOX.>", "_INBOX_ledger.>", "_INBOX_worker-r2.>"]  # everyone's, the ledger's, another worker's
    got, errors = asyncio.run(snoop(url(creds, attacker), snooped, run_r2_emits))
    assert wait_for_count(root, "select count(*) from steps where run_id = 'r2'", 20) == 20  # the ledger pulled them
    assert got == [], f"{attacker} read {len(got)} messages meant for others, e.g. {got[:3]}"
    refused = [e for e in errors if "permissions violation for subscription" in e.lower()]
    assert len(refused) == len(snooped), errors


def test_each_role_still_does_its_work_on_its_own_inbox(secure, tmp_path, monkeypatch):
    """The positive side: a worker publishes (its steps and the chain head it signs at close) and asks the
    ledger about its chains, an agent and notify make and pull from their own consumers, the ledger stores;
    each with replies on its own inbox."""
    from runledger.ledger.tlog import chainheads

    monkeypatch.setenv(chainheads.HEADS_ENV, "on")
    root, creds = secure

    async def subscribe(role: str, durable: str) -> None:
        nc = await bus.connect(url(creds, role), max_reconnect_attempts=0)
        await bus.ensure_consumer(nc.jetstream(), durable)
        await nc.close()

    # the agent's and notify's consumers exist before the worker publishes, as they would: the ledger prunes what
    # every durable consumer acked but the stream's last message (runledger.ledger.bus.retention), so a consumer
    # made after its prune would be given only the head
    for role, durable in (("agent", natsserver.AGENTS_DURABLE), ("notify", natsserver.NOTIFY_DURABLE)):
        asyncio.run(subscribe(role, durable))
    em = Emitter("r1", "worker-0", 0, url(creds, "worker-r1"), tmp_path / "spool")
    for s in range(5):
        em.emit_dict("step", STEP, step=s)
    assert em.close(30)
    assert wait_for_count(root, "select count(*) from steps", 5) == 5
    assert ledger_attempts("r1", "worker-0", url(creds, "worker-r1"), wait_s=10) == [0]

    async def pull(role: str, durable: str) -> int:
        nc = await bus.connect(url(creds, role), max_reconnect_attempts=0)
        assert nc.new_inbox().startswith(f"_INBOX_{role}.")
        js = nc.jetstream()
        await bus.ensure_consumer(js, durable)
        puller = await bus.Puller(nc, "RUNLEDGER", durable).start()
        msgs = await puller.fetch(10, timeout=5)
        events = 0
        for m in msgs:
            body = json.loads(m.data)
            events += len(body) if isinstance(body, list) else 1  # (a batch message holds several)
            await m.ack()
        await nc.close()
        return events

    assert wait_for_count(root, "select count(*) from chain_heads", 1) == 1
    assert asyncio.run(pull("agent", natsserver.AGENTS_DURABLE)) == 6  # the 5 steps and the head
    assert asyncio.run(pull("notify", natsserver.NOTIFY_DURABLE)) == 6


# ------------------------------------------------------------------------------------ alerts


AGENT = "agent-drops"
AGENT_ALERT = f"{AGENT}:r1:drop_fraction:1"  # an id the way runledger.agents.policy makes them


def agent_alert(alert_id: str, agent: str, message: str, state: str = "open") -> dict:
    return {"alert_id": alert_id, "agent": agent, "rule": "drop_fraction", "severity": "fail", "state": state,
            "message": message}


def emit(creds, who: str, run_id: str, producer: str, spool, kind: str, payload: dict) -> str:
    """One event as `who` (a credentials file's user) on `producer`'s chain (no chain head signed after it);
    its event_id once acked."""
    em = Emitter(run_id, producer, 0, url(creds, who), spool / producer, heads=False)
    eid = em.emit_dict(kind, payload, step=1)
    assert em.close(30), f"{who} could not publish {kind} as {producer}"
    return eid


def open_alerts(root) -> set[tuple[str, str, str]]:
    return set(reader(root).execute("select alert_id, producer, message from open_alerts where run_id = 'r1'").fetchall())


def replayed_open(root) -> set[tuple[str, str]]:
    state = replay("r1", run_events(root, "r1")).to_json()
    return {(a["alert_id"], a["producer"]) for a in state["open_alerts"]}


def test_a_worker_cannot_speak_for_an_agent_or_a_person(secure, tmp_path):
    """As worker-r1: an alert whose agent is an agent's name, worker kinds under an agent's and a person's
    producer name, and a signed chain head on the agent's chain (a seq of the agent's taken, were it
    stored). Each reaches the ledger (the server lets the worker publish on its run) and is quarantined
    with the reason; none is stored."""
    from runledger.ledger.tlog import chainheads

    root, creds = secure
    emit(creds, "worker-r1", "r1", "worker-0", tmp_path, "alert", agent_alert(AGENT_ALERT, AGENT, "forged"))
    emit(creds, "worker-r1", "r1", AGENT, tmp_path, "step", STEP)
    emit(creds, "worker-r1", "r1", "cli", tmp_path, "step", STEP)
    em = Emitter("r1", AGENT, 0, url(creds, "worker-r1"), tmp_path / AGENT)  # the agent's chain, continued
    em.emit_dict(chainheads.KIND, chainheads.HeadSigner("r1", AGENT, 0).payload(em.next_seq - 1, em._prev_hash, True))
    assert em.close(30)
    reasons = [r[0] for r in reader(root).execute("select reason from quarantine order by stream_seq").fetchall()]
    assert wait_for_count(root, "select count(*) from quarantine", 4, timeout=30) == 4, reasons
    reasons = [r[0] for r in reader(root).execute("select reason from quarantine order by stream_seq").fetchall()]
    assert "payload.agent 'agent-drops' is not the producer 'worker-0'" in reasons[0]
    assert "producer 'agent-drops' is an agent's or a person's name" in reasons[1]
    assert "producer 'cli' is an agent's or a person's name" in reasons[2]
    assert "producer 'agent-drops' is an agent's or a person's name, and a 'chain_head' event is a worker's" in reasons[3]
    assert reader(root).execute("select count(*) from events").fetchone()[0] == 0


def test_a_worker_neither_resolves_nor_rewrites_an_agents_alert_but_a_person_resolves_it(secure, tmp_path):
    """The agent raises an alert on r1. As worker-r1, under its own name: an alert with the agent's
    alert_id and another message, then a `resolved` of that id. The agent's alert stays open, as it
    said it, in the `open_alerts` view and in replay; the worker's own is closed by its own resolution.
    Then a person (producer `cli`) resolves it, and it is closed."""
    root, creds = secure
    emit(creds, "agent", "r1", AGENT, tmp_path, "alert", agent_alert(AGENT_ALERT, AGENT, "drops above 7%"))
    worker = Emitter("r1", "worker-0", 0, url(creds, "worker-r1"), tmp_path / "worker-0")
    worker.emit_dict("alert", agent_alert(AGENT_ALERT, "worker-0", "all is well"), step=2)
    worker.emit_dict("alert", agent_alert(AGENT_ALERT, "worker-0", "all is well", state="resolved"), step=3)
    assert worker.close(30)
    assert wait_for_count(root, "select count(*) from alerts", 3, timeout=30) == 3
    assert open_alerts(root) == {(AGENT_ALERT, AGENT, "drops above 7%")}
    assert replayed_open(root) == {(AGENT_ALERT, AGENT)}

    emit(creds, "agent", "r1", "cli", tmp_path, "alert", agent_alert(AGENT_ALERT, "person:ann", "looked at it", "resolved"))
    assert wait_for_count(root, "select count(*) from alerts", 4, timeout=30) == 4
    assert open_alerts(root) == set()
    assert replayed_open(root) == set()


class Keeper:
    """An HTTP server on loopback that keeps the body of every request, by path."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.bodies: list[tuple[str, bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.bodies.append((self.path, body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", natsserver.free_port()), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_notify_routes_for_agents_do_not_deliver_a_workers_forgery(secure, tmp_path):
    """notify (its own credentials) with a route on `agents = ["agent-*"]` and one on `producers =
    ["agent-*"]`. As worker-r1, an alert that names agent-drops as its agent; then the agent's own alert.
    Each route delivers the agent's (so it has passed the forgery, which came first), never the forgery."""
    from runledger.interop.notify import serve
    from runledger.interop.routes import Route

    root, creds = secure
    receiver = Keeper()
    routes = [Route("by-agent", f"{receiver.url}/agent", agents=("agent-*",)),
              Route("by-producer", f"{receiver.url}/producer", producers=("agent-*",))]

    async def main():
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(serve(routes, url(creds, "notify"), from_start=True, stop=stop, ready=ready, poll_s=0.2))
        await asyncio.wait_for(ready.wait(), 15)
        await asyncio.to_thread(emit, creds, "worker-r1", "r1", "worker-0", tmp_path, "alert",
                                agent_alert(AGENT_ALERT, AGENT, "FORGED by a worker"))
        await asyncio.to_thread(emit, creds, "agent", "r1", AGENT, tmp_path, "alert",
                                agent_alert(AGENT_ALERT, AGENT, "GENUINE from the agent"))
        for _ in range(300):  # a watchdog of 15 s
            if {p for p, _ in receiver.bodies} == {"/agent", "/producer"}:
                break
            await asyncio.sleep(0.05)
        stop.set()
        await task

    try:
        asyncio.run(main())
    finally:
        receiver.close()
    delivered = {(path, b"GENUINE" in body, b"FORGED" in body) for path, body in receiver.bodies}
    assert delivered == {("/agent", True, False), ("/producer", True, False)}, delivered


# ------------------------------------------------------------------------------------ acknowledgements


def test_a_worker_cannot_acknowledge_a_page_but_notify_can(secure, tmp_path):
    """The agent pages (a fail alert) on a notify route that repeats until acknowledged. As worker-r1, an
    `alert_ack` of it: the server refuses the publish (a worker may not send that kind). A worker's name
    on an acknowledgement sent with credentials that may (the agent's): the ledger quarantines it with
    the reason, and notify, which checks events as the ledger does, does not take it. The page goes on
    repeating through both. Then notify's own (its credentials, producer `notify`) is stored, and the
    repeats stop."""
    import nats

    from runledger.interop.notify import serve
    from runledger.interop.routes import Route
    from runledger.ledger.emit.sealing import seal

    root, creds = secure
    receiver = Keeper()
    routes = [Route("oncall", f"{receiver.url}/page", kinds=("alert",), repeat_every_s=0.5)]
    ack = {"alert_id": AGENT_ALERT, "by": "mallory", "via": "webhook"}

    def pages() -> int:
        return sum(1 for p, _ in receiver.bodies if p == "/page")

    async def wait_pages(more_than: int, timeout: float = 15) -> int:
        for _ in range(int(timeout / 0.05)):
            if pages() > more_than:
                break
            await asyncio.sleep(0.05)
        return pages()

    async def as_worker() -> list[str]:
        errors: list[str] = []

        async def on_error(err):
            errors.append(str(err))

        env, wire = seal("r1", "worker-0", 0, 0, "alert_ack", ack, 1, "")
        nc = await nats.connect(url(creds, "worker-r1"), error_cb=on_error, max_reconnect_attempts=0)
        await nc.publish("runledger.r1.alert_ack", wire.encode())
        await nc.flush()
        await asyncio.sleep(1.0)
        await nc.close()
        return errors

    async def main():
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(serve(routes, url(creds, "notify"), from_start=True, stop=stop, ready=ready,
                                         poll_s=0.2))
        await asyncio.wait_for(ready.wait(), 15)
        await asyncio.to_thread(emit, creds, "agent", "r1", AGENT, tmp_path, "alert",
                                agent_alert(AGENT_ALERT, AGENT, "drops above 7%"))
        assert await wait_pages(1) >= 2  # paged, and repeated

        errors = await as_worker()
        assert any("permissions violation for publish" in e.lower() and "alert_ack" in e for e in errors), errors
        await asyncio.to_thread(emit, creds, "agent", "r1", "worker-0", tmp_path, "alert_ack", ack)
        assert await asyncio.to_thread(wait_for_count, root, "select count(*) from quarantine", 1, 30) == 1
        seen = pages()
        assert await wait_pages(seen + 1) > seen + 1  # still paging

        await asyncio.to_thread(emit, creds, "notify", "r1", "notify", tmp_path, "alert_ack",
                                {**ack, "by": "alice"})
        assert await asyncio.to_thread(wait_for_count, root, "select count(*) from alert_acks", 1, 30) == 1
        await asyncio.sleep(1.0)  # (notify reads it: at most a repeat in flight)
        settled = pages()
        await asyncio.sleep(2.0)
        stop.set()
        await task
        return settled

    try:
        settled = asyncio.run(main())
    finally:
        receiver.close()
    assert pages() == settled  # no repeat once acknowledged
    reason = reader(root).execute("select reason from quarantine").fetchone()[0]
    assert "an alert_ack is a person's or notify's" in reason and "'worker-0'" in reason, reason
    assert reader(root).execute("select producer, \"by\" from alert_acks").fetchall() == [("notify", "alice")]
