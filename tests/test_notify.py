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
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from audit_ledger import T0, Ledger
from conftest import REPO, cli, reader, wait_for_count
from runledger.agents import stall
from runledger.agents.runner import evaluate, recent_runs, run_agents
from runledger.interop.notify import (BACKOFF_BASE_S, BACKOFF_CAP_S, backoff_s, json_body, request_body, serve, slack_body)
from runledger.interop.routes import Route, RoutesError, parse_routes
from runledger.ledger.bus import jetstream as bus, natsserver
from runledger.ledger.emit.emitter import Emitter
from runledger.ledger.bus.natsserver import free_port
from runledger.ledger.emit.sealing import seal

STEP = {"loss": 2.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 64, "step_time_s": 0.05}
START = {"config": {}, "config_hash": "0" * 64, "token_budget": None}  # (replay reads token_budget as a key)
SEVERITIES = ("info", "warn", "fail")


def alert(i: int, severity: str, state: str = "open") -> dict:
    return {"alert_id": f"a{i}", "agent": "agent-test", "rule": "test_rule", "severity": severity, "state": state,
            "message": f"alert <{i}> & more"}


def decision(i: int) -> dict:
    return {"decision_id": f"d{i}", "agent": "agent-test", "rule": "test_rule", "action": "checkpoint_now",
            "rationale": f"decision {i}"}


# ------------------------------------------------------------------------------------ the receiver


class Receiver:
    """A webhook receiver on loopback: fails its first `fail_first` requests with 500, can be taken down
    (its socket closed: connections refused) and up again on the same port, and keeps each path's
    deliveries once per Idempotency-Key (`kept`), counting the repeats it dropped (`repeats`)."""

    def __init__(self, fail_first: int = 0) -> None:
        self.port = free_port()
        self.fail_left = fail_first
        self.kept: dict[str, dict[str, dict]] = {}  # path -> key -> body
        self.order: dict[str, list[str]] = {}  # path -> keys in the order first kept
        self.repeats = 0
        self.requests = 0
        self.mismatched: list[str] = []  # a body whose event id is not its Idempotency-Key
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    def up(self) -> "Receiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = self.headers["Idempotency-Key"]
                with receiver.lock:
                    receiver.requests += 1
                    if receiver.fail_left > 0:
                        receiver.fail_left -= 1
                        status = 500
                    else:
                        status = 200
                        inner = body.get("event_id") or body["blocks"][1]["elements"][0]["text"]
                        if key not in inner:
                            receiver.mismatched.append(key)
                        kept = receiver.kept.setdefault(self.path, {})
                        if key in kept:
                            receiver.repeats += 1
                        else:
                            kept[key] = body
                            receiver.order.setdefault(self.path, []).append(key)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def down(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def keys(self, path: str) -> set[str]:
        with self.lock:
            return set(self.kept.get(path, {}))

    def wait_for(self, path: str, expected: set[str], timeout: float = 60) -> set[str]:
        deadline = time.monotonic() + timeout
        while self.keys(path) < expected and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.keys(path)


@pytest.fixture
def receiver():
    r = Receiver(fail_first=3).up()
    yield r
    r.down()


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


# ------------------------------------------------------------------------------------ pure parts


def test_routes_take_what_they_name_and_refuse_what_they_do_not_know():
    [everything, oncall] = parse_routes("""
[[route]]
name = "everything"
url = "http://127.0.0.1:1/json"
[[route]]
name = "oncall"
url = "https://hooks.example/slack"
format = "slack"
severity = ["fail"]
agents = ["agent-*"]
runs = ["prod-*"]
""")
    env = {"kind": "alert", "run_id": "prod-7", "producer": "agent-x",
           "payload": {"severity": "fail", "agent": "agent-drops"}}
    assert everything.matches(env) and oncall.matches(env)
    assert not oncall.matches({**env, "run_id": "dev-1"})
    assert not oncall.matches({**env, "payload": {"severity": "warn", "agent": "agent-drops"}})
    assert not oncall.matches({**env, "payload": {"severity": "fail", "agent": "person:ann"}})
    decided = {"kind": "decision", "run_id": "prod-7", "producer": "agent-x", "payload": {"agent": "agent-drops"}}
    assert oncall.matches(decided)  # a decision has no severity: the severity condition is the alerts'
    assert not Route("r", "http://x/", kinds=("alert",)).matches(decided)
    for bad, reason in (('[[route]]\nname="a"\nurl="http://x/"\nseverty=["fail"]', "unknown key 'severty'"),
                        ('[[route]]\nname="a"\nurl="ftp://x/"', "not an http(s) URL"),
                        ('[[route]]\nname="a"\nurl="http://x/"\nformat="teams"', "format 'teams'"),
                        ('[[route]]\nname="a"\nurl="http://x/"\nseverity=["page"]', "severity 'page'"),
                        ('[[route]]\nname="a"\nurl="http://x/"\n[[route]]\nname="a"\nurl="http://y/"', "used twice"),
                        ('[[route]]\nname="a"\nurl="http://x/"\nheaders={A="env:NOPE_UNSET"}', "$NOPE_UNSET"),
                        ("", "no routes")):
        with pytest.raises(RoutesError, match=reason.replace("(", r"\(").replace(")", r"\)").replace("$", r"\$")):
            parse_routes(bad, env={})
    [r] = parse_routes('[[route]]\nname="a"\nurl="http://x/"\nheaders={Authorization="env:TOKEN"}', env={"TOKEN": "t"})
    assert r.headers == {"Authorization": "t"}
    [j] = parse_routes('{"route": [{"name": "a", "url": "http://x/", "format": "slack", "runs": "prod-*"}]}', ".json")
    assert (j.format, j.runs, j.kinds) == ("slack", ("prod-*",), ("alert", "decision"))


def test_notify_refuses_a_bad_routes_file_with_a_reason(tmp_path):
    bad = tmp_path / "routes.toml"
    bad.write_text('[[route]]\nname = "a"\nurl = "http://127.0.0.1:1/"\nformat = "teams"\n')
    done = cli("notify", "--routes", str(bad), "--nats", "nats://127.0.0.1:1")
    assert done.returncode == 2 and "format 'teams' is not one of slack, json" in done.stderr


def test_payloads_carry_the_event_id_and_say_what_happened():
    env, _ = seal("r1", "agent-test", 0, 0, "alert", alert(1, "fail"), 5, "")
    slack = slack_body(env)
    assert set(slack) == {"text", "blocks"}
    assert slack["text"].startswith("[FAIL] r1: test_rule: alert &lt;1&gt; &amp; more")  # Slack's escaping
    assert env["event_id"] in slack["blocks"][1]["elements"][0]["text"]
    generic = json_body(env)
    assert generic["event"] == env and generic["idempotency_key"] == env["event_id"]
    assert json.loads(request_body(Route("j", "http://x/"), env)) == json.loads(json.dumps(generic))
    resolved, _ = seal("r1", "agent-test", 0, 1, "alert", alert(1, "fail", "resolved"), 6, env["hash"])
    assert json_body(resolved)["summary"].startswith("[RESOLVED] r1: test_rule")
    made, _ = seal("r1", "agent-test", 0, 2, "decision", decision(1), 6, resolved["hash"])
    assert json_body(made)["summary"].startswith("[DECISION] r1: checkpoint_now {}: decision 1")


def test_backoff_doubles_up_to_its_cap_with_jitter():
    import random

    rng = random.Random(0)
    for n in range(1, 20):
        full = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (n - 1))
        waits = [backoff_s(n, rng) for _ in range(50)]
        assert all(full / 2 <= w <= full for w in waits)
        assert len(set(waits)) > 1  # jittered
    assert backoff_s(1000, rng) <= BACKOFF_CAP_S


def stalled_run(root: Path, *, gap_s: float = 1.0, steps: int = 30, alert_open: bool = False, after: int = 0,
                finished: bool = False) -> None:
    """A run whose steps came `gap_s` apart, long ago (so it is silent now); with `alert_open`, a stall
    alert recorded after them, and `after` steps after that."""
    led = Ledger(root)
    led.emit("r", "run_started", START, 0, T0)
    t = T0
    for k in range(1, steps + 1):
        t += timedelta(seconds=gap_s)
        led.emit("r", "step", STEP, k, t)
    led.write()  # (stream order: the steps, then the alert)
    if alert_open:
        led.emit("r", "alert", {"alert_id": f"{stall.NAME}:r:stalled:{steps}", "agent": stall.NAME, "rule": "stalled",
                                "message": "stalled"}, steps, t, producer=stall.NAME)
        led.write()
    for k in range(steps + 1, steps + 1 + after):
        t += timedelta(seconds=gap_s)
        led.emit("r", "step", STEP, k, t)
    if finished:
        led.emit("r", "run_finished", {"status": "completed"}, steps + after, t)
    led.write()


def test_the_stall_agent_opens_on_silence_and_resolves_when_steps_come_back(tmp_path):
    stalled_run(tmp_path / "silent")
    _, [(agent, opened)] = evaluate(tmp_path / "silent", "r", agents=(stall,))
    assert (agent, opened.kind, opened.rule, opened.state) == (stall.NAME, "alert", "stalled", "open")
    assert opened.id == f"{stall.NAME}:r:stalled:30" and opened.evidence["rows"][0]["median_gap_s"] == pytest.approx(1.0)

    stalled_run(tmp_path / "still", alert_open=True)  # still silent, alert open: nothing new
    assert evaluate(tmp_path / "still", "r", agents=(stall,))[1] == []

    stalled_run(tmp_path / "back", alert_open=True, after=3)
    _, [(_, resolved)] = evaluate(tmp_path / "back", "r", agents=(stall,))
    assert (resolved.id, resolved.state, resolved.key) == (opened.id, "resolved", opened.id + ":resolved")
    assert resolved.event(stall.NAME).state == "resolved"

    stalled_run(tmp_path / "done", alert_open=True, finished=True)  # it ended: the stall is over too
    assert [a.state for _, a in evaluate(tmp_path / "done", "r", agents=(stall,))[1]] == ["resolved"]
    stalled_run(tmp_path / "finished", finished=True)  # a finished run is not stalled
    assert evaluate(tmp_path / "finished", "r", agents=(stall,))[1] == []


def test_restarted_agents_watch_the_unfinished_runs_heard_from_lately(tmp_path):
    """A run that went silent before the agents (re)started sends nothing to wake them: they watch the
    recent unfinished runs from the start (runledger.agents.runner.recent_runs)."""
    led = Ledger(tmp_path)
    now = datetime.now(timezone.utc)
    for run_id, at, finished in (("silent", now - timedelta(minutes=5), False), ("done", now, True),
                                 ("ancient", now - timedelta(days=30), False)):
        led.emit(run_id, "run_started", START, 0, at)
        led.emit(run_id, "step", STEP, 1, at)
        if finished:
            led.emit(run_id, "run_finished", {"status": "completed"}, 1, at)
    led.write()
    assert recent_runs(tmp_path) == {"silent"}
    assert recent_runs(tmp_path / "nothing-yet") == set()


# ------------------------------------------------------------------------------------ delivery, live


def notify_process(tmp_path: Path, routes: Path, url: str) -> subprocess.Popen:
    log = open(tmp_path / "notify.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "notify", "--routes", str(routes), "--nats", url,
                             "--from-start"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


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


async def publish_raw(url: str, subject: str, body: bytes) -> None:
    nc = await bus.connect(url)
    await nc.jetstream().publish(subject, body)
    await nc.close()


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
        for k in range(20):  # steps ~0.05 s apart, then a pause: no event wakes the agents, their sweep does
            em.emit_dict("step", STEP, step=k)
            time.sleep(0.05)
        stalled = "select count(*) from alerts where rule = 'stalled' and state = '{}'"
        assert wait_for_count(root, stalled.format("open"), 1, timeout=30) == 1
        for k in range(20, 25):  # steps come back
            em.emit_dict("step", STEP, step=k)
        assert wait_for_count(root, stalled.format("resolved"), 1, timeout=30) == 1
        em.emit_dict("run_finished", {"status": "completed"}, step=24)
        assert em.close(timeout=30)
        deadline = time.monotonic() + 30
        while len(receiver.order.get("/json", [])) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        opened, resolved = (receiver.kept["/json"][k]["event"]["payload"] for k in receiver.order["/json"][:2])
        assert (opened["rule"], opened["state"], resolved["state"]) == ("stalled", "open", "resolved")
        assert opened["alert_id"] == resolved["alert_id"]  # the resolution names the alert it closes
        assert reader(root).execute("select count(*) from alerts").fetchone()[0] == 2  # once each
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
