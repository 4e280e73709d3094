"""`runledger notify --ack-listen HOST:PORT`: a small HTTP listener that takes a page for a person (`POST /ack`).

    curl -X POST http://127.0.0.1:8765/ack -H "Authorization: Bearer $(cat ack.token)" \
         -d '{"run": "prod-7", "alert_id": "loss_spike", "by": "alice"}'

The body names the run, the alert and the person (`note` optional); the listener records it as an
`alert_ack` event from producer `notify` (runledger.ledger.decisions.acknowledge: spooled first, so an
acknowledgement answered 200 or 202 is never lost), and notify stops repeating the page once that event
comes back through its consumer: the record, not this listener, is what stops it.

Every request needs the token of `--ack-token-file` (a file holding it, at least 16 characters) in
`Authorization: Bearer T` or `X-Runledger-Token`, compared in constant time; a body is JSON of at most
MAX_BODY bytes. Answers: 200 recorded, 202 spooled (NATS has not acknowledged it yet: it will be sent),
400 a bad body, 401 no or a wrong token, 404 another path, 405 another method, 413 too large.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from runledger.ledger.decisions import acknowledge

log = logging.getLogger(__name__)

MAX_BODY = 16 * 1024  # bytes of a request's body (an acknowledgement is a few hundred)
RECORD_TIMEOUT_S = 10.0  # how long a request waits for NATS to take the event (else it stays spooled: 202)
MIN_TOKEN = 16


class AckHookError(ValueError):
    """The listener cannot start: a bad address or token file; the message is the one-line reason."""


def read_token(path: str | Path) -> str:
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as err:
        raise AckHookError(f"cannot read the ack token file {path}: {err}") from None
    if len(token) < MIN_TOKEN or any(c.isspace() for c in token):
        raise AckHookError(f"{path}: the ack token is one word of at least {MIN_TOKEN} characters")
    return token


def parse_listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise AckHookError(f"--ack-listen {text!r}: give HOST:PORT, e.g. 127.0.0.1:8765")
    return host.strip("[]"), int(port)


class AckListener:
    """The listener: `start()` serves on a daemon thread until `stop()`; `record(run_id, ack)` emits."""

    def __init__(self, host: str, port: int, token: str, root, nats_url: Callable[[], str | None]) -> None:
        self.token, self.root, self.nats_url = token, root, nats_url
        listener = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "runledger-notify-ack"
            sys_version = ""

            def do_POST(self):
                listener.handle(self)

            def do_GET(self):
                self._plain(405, "POST /ack")

            def _plain(self, status: int, text: str):
                listener.answer(self, status, {"error": text})

            def log_message(self, fmt, *args):
                log.debug("ack listener: " + fmt, *args)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def start(self) -> "AckListener":
        threading.Thread(target=self.server.serve_forever, name="ack-listener", daemon=True).start()
        log.info("ack listener on %s:%d (POST /ack)", *self.server.server_address[:2])
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def answer(handler: BaseHTTPRequestHandler, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("Cache-Control", "no-store")
        handler.end_headers()
        handler.wfile.write(data)

    def _authorized(self, headers) -> bool:
        auth = headers.get("Authorization", "")
        given = (auth[7:].strip() if auth.lower().startswith("bearer ") else "") or headers.get("X-Runledger-Token", "")
        return bool(given) and hmac.compare_digest(given.encode(), self.token.encode())

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        if h.path.split("?", 1)[0] != "/ack":
            return self.answer(h, 404, {"error": "POST /ack"})
        if not self._authorized(h.headers):
            return self.answer(h, 401, {"error": "a valid token is required (Authorization: Bearer TOKEN)"})
        length = h.headers.get("Content-Length", "")
        if not length.isdigit() or int(length) > MAX_BODY:
            return self.answer(h, 413, {"error": f"a body of at most {MAX_BODY} bytes, with its Content-Length"})
        try:
            body = json.loads(h.rfile.read(int(length)))
            if not isinstance(body, dict) or set(body) - {"run", "alert_id", "by", "note"}:
                raise acknowledge.AckRefused("the body is JSON {run, alert_id, by, note?}")
            for k in ("run", "alert_id", "by"):
                if not isinstance(body.get(k), str) or not body[k]:
                    raise acknowledge.AckRefused(f"{k!r} must be a non-empty string")
            ack = acknowledge.acknowledgement(body["alert_id"], body["by"].strip(), "webhook", body.get("note"))
            acked = acknowledge.record(self.root, self.nats_url(), body["run"], ack, "notify", RECORD_TIMEOUT_S)
        except (ValueError, TypeError) as err:  # (AckRefused, InvalidEvent, a JSON error, a validation error)
            return self.answer(h, 400, {"error": str(err).splitlines()[0][:300]})
        log.info("alert %s of run %s acknowledged by %s (%s)", body["alert_id"], body["run"], body["by"],
                 "recorded" if acked else "spooled")
        self.answer(h, 200 if acked else 202, {"acknowledged": acked, "run": body["run"], "alert_id": body["alert_id"],
                                               **({} if acked else {"note": "spooled: it will be sent"})})
