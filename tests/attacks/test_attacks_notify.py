"""Attacks on `runledger notify`: a receiver that redirects, one that trickles its answer, a hostile routes file.

The promises: a delivery is a POST answered 2xx by the route's own URL, and a route's headers go to no
other host; every request ends within the route's timeout_s, and notify stops on SIGTERM/SIGINT even
while a receiver stalls it; a routes file is checked up front, and no error message carries a secret
of its URLs or headers. Receivers are real HTTP servers on loopback; NATS is the real one.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from runledger.interop import notify
from runledger.interop.notify import serve
from runledger.interop.routes import Route
from runledger.ledger.bus import jetstream as bus
from runledger.ledger.bus.natsserver import free_port
from runledger.ledger.emit.emitter import Emitter
from support.processes import runledger
from support.webhooks import notify_process

SECRET = "s3cret-TOKEN"  # in the routes' paths, queries, userinfo and headers: it must never leave them
WATCHDOG_S = 15  # a process that has not exited by then is killed, and the test fails


class Recorder:
    """An HTTP server on loopback that keeps every request it gets (method, path, headers) and answers
    with `answer(recorder, index)`: (status, extra headers) for a quick reply, or "trickle" to send its
    status line then one byte every `trickle_s` until the client goes away."""

    def __init__(self, answer=lambda rec, i: (200, {}), trickle_s: float = 2.0) -> None:
        self.answer, self.trickle_s = answer, trickle_s
        self.port = free_port()
        self.requests: list[tuple[str, str, dict]] = []
        self.lock = threading.Lock()
        self.closing = threading.Event()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_any(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                with recorder.lock:
                    index = len(recorder.requests)
                    recorder.requests.append((self.command, self.path, dict(self.headers)))
                reply = recorder.answer(recorder, index)
                if reply == "trickle":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                    self.wfile.flush()
                    try:
                        while not recorder.closing.wait(recorder.trickle_s):
                            self.wfile.write(b"X")
                            self.wfile.flush()
                    except OSError:  # the client went away
                        pass
                    return
                status, headers = reply
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_GET = do_PUT = do_HEAD = handle_any

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self) -> int:
        with self.lock:
            return len(self.requests)

    def wait_for(self, n: int, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.count() < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.count()

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


def emit_alert(url: str, spool: Path) -> str:
    em = Emitter("r1", "agent-test", 0, url, spool)
    eid = em.emit_dict("alert", {"alert_id": "a1", "agent": "agent-test", "rule": "test_rule", "severity": "fail",
                                 "message": "the loss spiked"}, step=1)
    assert em.close(timeout=30)
    return eid


async def consumer_floor(url: str) -> int:
    nc = await bus.connect(url)
    try:
        return (await nc.jetstream().consumer_info("RUNLEDGER", "notify")).ack_floor.stream_seq
    finally:
        await nc.close()


@pytest.fixture
def quick_retries(monkeypatch):
    """Retries a few hundredths of a second apart (the backoff's shape is test_notify's), so that a test
    sees many tries of one event."""
    monkeypatch.setattr(notify, "BACKOFF_BASE_S", 0.05)
    monkeypatch.setattr(notify, "BACKOFF_CAP_S", 0.2)


# ------------------------------------------------------------------------------------ redirects


def test_a_redirect_is_a_failure_and_the_other_host_gets_nothing(tmp_path, nats_server, quick_retries, caplog):
    """A route answers each redirect status in turn, pointing at a second server; the event stays unacked
    and the second server hears nothing, no request and no Authorization; once the route answers 200
    the event is delivered there, and acked."""
    other = Recorder()
    redirects = (301, 302, 303, 307, 308) * 2
    taking = threading.Event()

    def answer(rec, i):
        if taking.is_set():
            return 200, {}
        return redirects[i % len(redirects)], {"Location": f"http://127.0.0.1:{other.port}/stolen"}

    route_server = Recorder(answer)
    route = Route("hook", f"http://127.0.0.1:{route_server.port}/hook/{SECRET}?key={SECRET}",
                  headers={"Authorization": f"Bearer {SECRET}"}, timeout_s=5)
    eid = emit_alert(nats_server.url, tmp_path / "spool")

    async def scenario():
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(serve([route], nats_server.url, from_start=True, stop=stop, ready=ready,
                                         poll_s=0.2))
        try:
            await asyncio.wait_for(ready.wait(), 30)
            tried = await asyncio.to_thread(route_server.wait_for, len(redirects), 30)
            floor_while_redirected = await consumer_floor(nats_server.url)
            taking.set()
            before = route_server.count()
            await asyncio.to_thread(route_server.wait_for, before + 1, 30)
            deadline = time.monotonic() + 30
            while await consumer_floor(nats_server.url) < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            return tried, floor_while_redirected, await consumer_floor(nats_server.url)
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)

    try:
        with caplog.at_level(logging.DEBUG, logger="runledger.interop.notify"):
            tried, floor_while_redirected, floor_after = asyncio.run(scenario())
        assert other.requests == [], f"the redirect was followed: {other.requests[:1]}"
        assert tried >= len(redirects) and floor_while_redirected == 0  # each redirect a failure, nothing acked
        assert floor_after == 1  # delivered by the route's own URL, then acked
        assert all(m == "POST" and h.get("Idempotency-Key") == eid for m, _, h in route_server.requests)
        for status in (301, 302, 303, 307, 308):
            assert f"HTTP {status}" in caplog.text
        assert SECRET not in caplog.text
    finally:
        route_server.close()
        other.close()


# ------------------------------------------------------------------------------------ a trickling receiver


def test_a_trickling_receiver_fails_within_the_deadline_and_is_tried_again(tmp_path, nats_server, quick_retries,
                                                                          caplog):
    """One byte every 2 s under timeout_s = 5: each try ends as a logged failure near its deadline, and a
    second try follows (a socket timeout alone is per read: the first try would never end)."""
    trickler = Recorder(lambda rec, i: "trickle", trickle_s=2.0)
    route = Route("slow", f"http://127.0.0.1:{trickler.port}/hook/{SECRET}", timeout_s=5)
    emit_alert(nats_server.url, tmp_path / "spool")

    async def scenario():
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(serve([route], nats_server.url, from_start=True, stop=stop, ready=ready,
                                         poll_s=0.2))
        try:
            await asyncio.wait_for(ready.wait(), 30)
            return await asyncio.to_thread(trickler.wait_for, 2, 5 * 4)
        finally:
            stop.set()
            await asyncio.wait_for(task, WATCHDOG_S)

    try:
        with caplog.at_level(logging.DEBUG, logger="runledger.interop.notify"):
            tries = asyncio.run(scenario())
        assert tries >= 2, "the first request never ended"
        assert "not delivered (timed out" in caplog.text
        assert SECRET not in caplog.text
    finally:
        trickler.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_stops_notify_while_a_receiver_trickles(tmp_path, nats_server, sig):
    trickler = Recorder(lambda rec, i: "trickle", trickle_s=2.0)
    routes = tmp_path / "routes.toml"
    routes.write_text(f'[[route]]\nname = "slow"\nurl = "http://127.0.0.1:{trickler.port}/hook"\ntimeout_s = 60\n')
    emit_alert(nats_server.url, tmp_path / "spool")
    proc = notify_process(tmp_path, routes, nats_server.url)
    try:
        assert trickler.wait_for(1, 30) == 1  # notify is inside the stalled request now
        time.sleep(0.5)
        proc.send_signal(sig)
        try:
            code = proc.wait(WATCHDOG_S)
        except subprocess.TimeoutExpired:
            code = None
        assert code == 0, f"notify did not stop on {sig.name} within {WATCHDOG_S}s (exit {code})"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        trickler.close()


# ------------------------------------------------------------------------------------ hostile routes files


HOSTILE = {
    "CRLF in a header value": f'headers = {{ X-Token = "{SECRET}\\r\\nX-Injected: 1" }}',
    "LF in a header value": f'headers = {{ X-Token = "{SECRET}\\nX-Injected: 1" }}',
    "NUL in a header value": f'headers = {{ X-Token = "{SECRET}\\u0000" }}',
    "CRLF in a header name": f'headers = {{ "X-A\\r\\nX-B" = "{SECRET}" }}',
    "a space in a header name": f'headers = {{ "X A" = "{SECRET}" }}',
    "a header notify sets": f'headers = {{ Content-Length = "{SECRET}" }}',
    "an env header with a newline": 'headers = { X-Token = "env:RL_TEST_NOTIFY_CRLF" }',
    "an empty env name": 'headers = { X-Token = "env:" }',
}
HOSTILE_URLS = {
    "port 99999": f"http://user:{SECRET}@127.0.0.1:99999/hook/{SECRET}?k={SECRET}",
    "port 0": f"http://127.0.0.1:0/hook/{SECRET}",
    "a port that is not a number": f"http://127.0.0.1:{SECRET}/hook",
    "scheme ftp": f"ftp://127.0.0.1/hook/{SECRET}?k={SECRET}",
    "scheme file": f"file:///etc/{SECRET}",
    "no scheme": f"hooks.example.com/services/{SECRET}",
    "no host": f"http:///{SECRET}",
    "userinfo": f"http://{SECRET}@127.0.0.1:8080/hook",
    "CRLF in the url": f"http://127.0.0.1:8080/hook/{SECRET}\\r\\nX-Injected: 1",
    "a space in the host": f"http://bad host:8080/{SECRET}",
    "a control character in the path": f"http://127.0.0.1:8080/{SECRET}\\u0007",
}


def hostile_files() -> list[tuple[str, str]]:
    base = 'name = "r"\nurl = "http://127.0.0.1:8080/hook/{}"\n'.format(SECRET)
    cases = [(why, f"[[route]]\n{base}{extra}\n") for why, extra in HOSTILE.items()]
    cases += [(why, f'[[route]]\nname = "r"\nurl = "{url}"\n') for why, url in HOSTILE_URLS.items()]
    cases += [("timeout_s 0", f"[[route]]\n{base}timeout_s = 0\n"),
              ("timeout_s 1e9", f"[[route]]\n{base}timeout_s = 1e9\n"),
              ("a bad kind", f'[[route]]\n{base}kinds = ["alert", "step"]\n'),
              ("a bad severity", f'[[route]]\n{base}severity = ["page"]\n'),
              ("a bad format", f'[[route]]\n{base}format = "teams"\n'),
              ("a glob with a newline", f'[[route]]\n{base}runs = ["prod-*\\nx"]\n'),
              ("a bad name", f'[[route]]\nname = "Bad Name"\nurl = "http://127.0.0.1:8080/hook/{SECRET}"\n')]
    return cases


@pytest.mark.parametrize("why,text", hostile_files(), ids=[w for w, _ in hostile_files()])
def test_a_hostile_routes_file_is_refused_in_one_line_without_its_secrets(tmp_path, why, text):
    path = tmp_path / "routes.toml"
    path.write_text(text)
    try:
        done = runledger("notify", "--routes", str(path), "--nats", "nats://127.0.0.1:1", timeout=WATCHDOG_S,
                         env={"RL_TEST_NOTIFY_CRLF": f"{SECRET}\r\nX-Injected: 1"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"{why}: accepted (notify ran on with it)")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, f"{why}: accepted (exit {done.returncode}): {done.stderr[-300:]}"
    assert len(lines) == 1, f"{why}: {lines}"
    assert SECRET not in done.stderr, f"{why}: the secret is in the message: {lines[0]}"


# ------------------------------------------------------------------------------------ lineage --to URL


def test_lineage_to_a_trickling_endpoint_fails_within_its_deadline():
    """`runledger lineage --to URL` is an outside call too: one byte every 0.5 s under a 2 s timeout ends as
    NotDelivered near 2 s, its message without the URL's path; it does not wait as long as bytes come."""
    from datetime import datetime, timezone

    from openlineage.client.event_v2 import Job, Run, RunEvent, RunState

    from runledger.interop import lineage, webhook

    trickler = Recorder(lambda rec, i: "trickle", trickle_s=0.5)
    event = RunEvent(eventType=RunState.START, eventTime=datetime.now(timezone.utc).isoformat(),
                     run=Run(runId=lineage.run_uuid("r1")), job=Job(namespace="runledger", name="r1"),
                     producer=lineage.PRODUCER)
    outcome: list[BaseException | None] = []

    def send():
        try:
            lineage.post([event], f"http://127.0.0.1:{trickler.port}/api/v1/lineage/{SECRET}", timeout=2)
            outcome.append(None)
        except BaseException as err:
            outcome.append(err)

    sender = threading.Thread(target=send, daemon=True)
    try:
        sender.start()
        sender.join(WATCHDOG_S)
        assert not sender.is_alive(), f"lineage still posting {WATCHDOG_S}s into a 2 s timeout"
        [err] = outcome
        assert isinstance(err, webhook.NotDelivered) and SECRET not in str(err), repr(err)
    finally:
        trickler.close()
