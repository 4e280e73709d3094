"""webhooks: shared by the tests (tests/support: every helper defined once)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.bus.natsserver import free_port
from support import REPO
from support.processes import free_port


def alert(i: int, severity: str, state: str = "open") -> dict:
    return {"alert_id": f"a{i}", "agent": "agent-test", "rule": "test_rule", "severity": severity, "state": state,
            "message": f"alert <{i}> & more"}


def decision(i: int) -> dict:
    return {"decision_id": f"d{i}", "agent": "agent-test", "rule": "test_rule", "action": "checkpoint_now",
            "rationale": f"decision {i}"}


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


def notify_process(tmp_path: Path, routes: Path, url: str) -> subprocess.Popen:
    log = open(tmp_path / "notify.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "notify", "--routes", str(routes), "--nats", url,
                             "--from-start"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


async def publish_raw(url: str, subject: str, *bodies: bytes) -> None:
    nc = await bus.connect(url)
    js = nc.jetstream()
    for body in bodies:
        await js.publish(subject, body)
    await nc.close()


class PageReceiver:
    """A receiver that keeps every request it takes, in order (nothing deduped): (path, Idempotency-Key,
    body as JSON or text, headers, monotonic time). What a person's phone would show, repeats and all."""

    def __init__(self) -> None:
        self.port = free_port()
        self.got: list[tuple[str, str, object, dict, float]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode()
                with receiver.lock:
                    receiver.got.append((self.path, self.headers["Idempotency-Key"], body, dict(self.headers),
                                         time.monotonic()))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def requests(self, path: str | None = None) -> list[tuple[str, str, object, dict, float]]:
        with self.lock:
            return [g for g in self.got if path is None or g[0] == path]

    def wait_until(self, check, timeout: float = 60) -> bool:
        """Wait until `check(self)` is true; whether it became so within `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check(self):
                return True
            time.sleep(0.1)
        return check(self)
