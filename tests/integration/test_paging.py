"""Paging through `runledger notify`, against a local receiver that keeps every request: a flapping alert
within its cooldown is sent once, low-severity alerts arrive as one digest, a page repeats until a
person acknowledges it through notify's ack listener (an `alert_ack` event in the record), then stops;
and notify SIGKILLed in between loses none of it. NATS, the ledger and the notify CLI are the real ones.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from runledger.interop.notify import DURABLE, ensure_consumer
from runledger.ledger.bus import jetstream as bus
from runledger.ledger.contract.events import STREAM
from runledger.ledger.emit.emitter import Emitter
from support import REPO
from support.processes import free_port
from support.reading import reader, wait_for_count
from support.webhooks import PageReceiver

ACK_WAIT_S = 3.0  # notify's consumer's (made short here): what a SIGKILLed notify held comes back this soon
REPEAT_S, DIGEST_S = 2, 3
TOKEN = "ack-token-0123456789abcdef"


def payload(alert_id: str, severity: str, n: int) -> dict:
    return {"alert_id": alert_id, "agent": "agent-test", "rule": alert_id, "severity": severity, "state": "open",
            "message": f"{alert_id} #{n}"}


def start_notify(tmp_path: Path, root: Path, url: str, routes: Path, ack_port: int) -> subprocess.Popen:
    log = open(tmp_path / "notify.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "notify", "--routes", str(routes),
                             "--nats", url, "--root", str(root), "--from-start",
                             "--ack-listen", f"127.0.0.1:{ack_port}", "--ack-token-file", str(tmp_path / "ack.token")],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def post_ack(port: int, body: dict, token: str = TOKEN, timeout: float = 30) -> tuple[int, dict]:
    deadline = time.monotonic() + timeout
    while True:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/ack", json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())
        except OSError:  # (not listening yet)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def alert_ids(reqs) -> list[str]:
    """The alert of each single-event request (a digest's are in digests())."""
    return [b["event"]["payload"]["alert_id"] for _, _, b, _, _ in reqs if isinstance(b, dict) and "event" in b]


def digests(reqs) -> list[list[str]]:
    return [[e["event"]["payload"]["alert_id"] for e in b["events"]] for _, _, b, _, _ in reqs
            if isinstance(b, dict) and b.get("kind") == "digest"]


async def consumer_pending(url: str) -> int:
    nc = await bus.connect(url)
    try:
        return (await nc.jetstream().consumer_info(STREAM, DURABLE)).num_ack_pending
    finally:
        await nc.close()


async def make_consumer(url: str) -> None:
    nc = await bus.connect(url)
    try:
        await bus.ensure_stream(nc.jetstream())
        await ensure_consumer(nc.jetstream(), DURABLE, True, ACK_WAIT_S, acks=True, holds=True)
    finally:
        await nc.close()


def test_cooldown_digest_and_a_page_repeated_until_acknowledged_through_a_sigkill(tmp_path, nats_server,
                                                                                 ledger_process):
    ledger_process.start()
    url, root = nats_server.url, ledger_process.root
    receiver = PageReceiver()
    routes = tmp_path / "routes.toml"
    routes.write_text(f"""
[[route]]
name = "oncall"
url = "http://127.0.0.1:{receiver.port}/pages"
kinds = ["alert"]
cooldown_s = 600
digest_every_s = {DIGEST_S}
repeat_every_s = {REPEAT_S}
""")
    (tmp_path / "ack.token").write_text(TOKEN + "\n")
    asyncio.run(make_consumer(url))
    ack_port = free_port()
    notify = start_notify(tmp_path, root, url, routes, ack_port)
    em = Emitter("r1", "agent-test", 0, url, tmp_path / "spool")
    try:
        # a flapping warn (three times in a minute), three infos, one fail
        def alert(alert_id: str, severity: str, n: int) -> None:  # (one message each, as an agent sends them)
            em.emit_dict("alert", payload(alert_id, severity, n))
            assert em.flush(timeout=30)

        for n in range(3):
            alert("flap", "warn", n)
        for n in range(3):
            alert(f"info-{n}", "info", n)
        alert("down", "fail", 0)
        assert receiver.wait_until(lambda r: digests(r.requests()) and alert_ids(r.requests()).count("down") >= 3), \
            (tmp_path / "notify.log").read_text()[-3000:]
        before = receiver.requests()
        assert alert_ids(before).count("flap") == 1  # within its cooldown: once
        assert digests(before) == [["info-0", "info-1", "info-2"]]  # one digest of the three
        keys = [k for _, k, b, _, _ in before if isinstance(b, dict) and b.get("event", {}).get("payload", {}).get(
            "alert_id") == "down"]
        assert keys[1:3] == [f"{keys[0]}:repeat:1", f"{keys[0]}:repeat:2"]  # the page, then its repeats

        # two more infos go into the next digest; notify is SIGKILLed holding them and the page
        for n in range(3, 5):
            alert(f"info-{n}", "info", n)
        time.sleep(1.0)  # (taken, waiting for their digest)
        notify.send_signal(signal.SIGKILL)
        notify.wait()
        killed_at = time.monotonic()
        notify = start_notify(tmp_path, root, url, routes, ack_port)

        # nothing lost: the digest comes, and the page goes on
        def after_restart(r):
            later = [g for g in r.requests() if g[4] > killed_at]
            return ["info-3", "info-4"] in digests(later) and alert_ids(later).count("down") >= 2

        assert receiver.wait_until(after_restart, timeout=60), [(k, b if isinstance(b, str) else b.get("summary"))
                                                               for _, k, b, _, t in receiver.requests() if t > killed_at]
        assert [d for d in digests(receiver.requests()) if "info-3" in d] == [["info-3", "info-4"]]

        # a person takes the page through notify's ack listener: an alert_ack in the record, and the repeats stop
        status, answer = post_ack(ack_port, {"run": "r1", "alert_id": "down", "by": "alice", "note": "on it"})
        assert status == 200 and answer["acknowledged"] is True, answer
        assert wait_for_count(root, "select count(*) from alert_acks", 1) == 1
        row = reader(root).execute("select producer, alert_id, \"by\", via, note from alert_acks").fetchone()
        assert row == ("notify", "down", "alice", "webhook", "on it")
        deadline = time.monotonic() + 30
        while asyncio.run(consumer_pending(url)) and time.monotonic() < deadline:  # the page's message, released
            time.sleep(0.2)
        assert asyncio.run(consumer_pending(url)) == 0
        pages = alert_ids(receiver.requests()).count("down")
        time.sleep(3 * REPEAT_S)
        assert alert_ids(receiver.requests()).count("down") == pages  # no repeat since

        # the listener refuses a wrong token and a bad body
        assert post_ack(ack_port, {"run": "r1", "alert_id": "down", "by": "mallory"}, token="x" * 24)[0] == 401
        assert post_ack(ack_port, {"run": "r1", "alert_id": "down", "by": "<script>"})[0] == 400
        assert post_ack(ack_port, {"run": "R.1", "alert_id": "down", "by": "bob"})[0] == 400
    finally:
        em.close(timeout=10)
        notify.send_signal(signal.SIGTERM)
        try:
            notify.wait(timeout=20)
        except subprocess.TimeoutExpired:
            notify.kill()
        receiver.down()


def test_the_dashboard_acknowledges_a_page_and_the_repeats_stop(tmp_path, nats_server, ledger_process):
    """The run page's Acknowledge (POST /api/ack with the read-write token) records an alert_ack from
    producer `ui` through NATS; notify, reading it back, stops the page."""
    from starlette.testclient import TestClient

    from runledger.interop.notify import serve
    from runledger.interop.routes import Route
    from runledger.ui.access import configure
    from runledger.ui.app import create_app

    ledger_process.start()
    url, root = nats_server.url, ledger_process.root
    receiver = PageReceiver()
    routes = [Route("oncall", f"http://127.0.0.1:{receiver.port}/pages", kinds=("alert",), repeat_every_s=0.5)]

    def pages() -> int:
        return alert_ids(receiver.requests()).count("down")

    async def main():
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(serve(routes, url, from_start=True, stop=stop, ready=ready, poll_s=0.2))
        await asyncio.wait_for(ready.wait(), 15)
        em = Emitter("r1", "agent-test", 0, url, tmp_path / "spool")
        em.emit_dict("alert", payload("down", "fail", 0))
        assert await asyncio.to_thread(em.close, 30)
        assert await asyncio.to_thread(receiver.wait_until, lambda r: pages() >= 3, 30)
        assert await asyncio.to_thread(wait_for_count, root, "select count(*) from alerts", 1) == 1

        def acknowledge():
            app = create_app(root, url, configure("127.0.0.1", token=TOKEN))
            with TestClient(app, base_url="http://127.0.0.1:8765") as c:
                return c.post("/api/ack", json={"run": "r1", "alert_id": "down", "by": "ada"},
                              headers={"x-runledger-token": TOKEN})

        answer = await asyncio.to_thread(acknowledge)
        assert answer.status_code == 200 and answer.json()["acknowledged"] is True, answer.text
        for _ in range(100):
            if not await asyncio.to_thread(asyncio.run, consumer_pending(url)):
                break
            await asyncio.sleep(0.2)
        settled = pages()
        await asyncio.sleep(2.0)  # four repeat periods
        stop.set()
        await task
        return settled

    try:
        settled = asyncio.run(main())
    finally:
        receiver.down()
    assert pages() == settled
    assert wait_for_count(root, "select count(*) from alert_acks", 1) == 1
    assert reader(root).execute("select producer, \"by\", via from alert_acks").fetchall() == [("ui", "ada", "dashboard")]


def test_a_consumer_made_before_paging_is_brought_to_take_acknowledgements(nats_server):
    """A notify consumer made without `alert_ack` (an older notify's) takes it once a route repeats pages."""

    async def main():
        nc = await bus.connect(nats_server.url)
        js = nc.jetstream()
        await bus.ensure_stream(js)
        await ensure_consumer(js, DURABLE, True)
        before = (await js.consumer_info(STREAM, DURABLE)).config.filter_subjects
        await ensure_consumer(js, DURABLE, True, acks=True, holds=True)
        after = (await js.consumer_info(STREAM, DURABLE)).config.filter_subjects
        await nc.close()
        return before, after

    before, after = asyncio.run(main())
    assert "runledger.*.alert_ack" not in before
    assert sorted(after) == sorted([*before, "runledger.*.alert_ack"])


def test_a_person_acknowledges_from_the_cli(tmp_path, nats_server, ledger_process):
    """`runledger decide RUN --ack ALERT_ID`: an alert_ack from producer `cli`, with the reason as its note;
    a name that is not one is refused in one line (exit 2)."""
    from support.processes import cli

    ledger_process.start()
    root = ledger_process.root
    done = cli("decide", "r1", "--ack", "down", "--by", "bob", "--reason", "on it", "--nats", nats_server.url,
               "--root", str(root))
    assert done.returncode == 0 and "acknowledged down of r1 as bob" in done.stdout, done.stderr
    assert wait_for_count(root, "select count(*) from alert_acks", 1) == 1
    row = reader(root).execute("select producer, alert_id, \"by\", via, note from alert_acks").fetchone()
    assert row == ("cli", "down", "bob", "cli", "on it")
    bad = cli("decide", "r1", "--ack", "down", "--by", "<b>", "--nats", nats_server.url, "--root", str(root))
    assert bad.returncode == 2 and "not a valid acknowledgement" in bad.stderr
