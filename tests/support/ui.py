"""ui: shared by the tests (tests/support: every helper defined once)."""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

from runledger.ui.access import configure
from runledger.ui.app import create_app


def client(root: Path, host: str, **tokens) -> TestClient:
    """The app as the page calls it: every request with the header no other origin's page can send."""
    return TestClient(create_app(root, None, configure(host, **tokens)), base_url="http://127.0.0.1:8765",
                      headers={"x-requested-with": "runledger"})


class UiProcess:
    """`runledger ui --root ROOT [ARGS]` as a child process on a free loopback port, its stderr in `log`; `line` is
    the address it printed once it listened (with its token, when it made one), `base` its origin. `stop()`."""

    def __init__(self, root: Path, log: Path, *args: str, env: dict | None = None):
        import subprocess
        import sys

        from support import REPO
        from support.processes import free_port

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self._log_path, self._log = log, open(log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "ui", "--root", str(root), *args,
                                      "--port", str(self.port)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True)
        self.line = self.proc.stdout.readline().strip()  # the address, once it listens
        if not self.line.startswith("http://"):
            self.stop()
            raise AssertionError(f"runledger ui did not start: {log.read_text()}")

    def stop(self) -> None:
        import subprocess

        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self._log.close()


class UiStack:
    """A nats-server and a ledger process over `tmp`/ledger, and (`start_ui`) `runledger ui` following them; `stop()`
    stops what was started, the dashboard first."""

    def __init__(self, tmp: Path):
        from runledger.ledger.bus.natsserver import NatsServer
        from support.processes import LedgerProcess

        self.tmp, self.root = tmp, tmp / "ledger"
        self.root.mkdir()
        self.nats = NatsServer(tmp / "nats").start()
        self.ledger = LedgerProcess(self.root, self.nats.url, tmp / "ledger.log").start()
        self.ui: UiProcess | None = None

    def start_ui(self, *args: str) -> UiProcess:
        self.ui = UiProcess(self.root, self.tmp / "ui.log", "--nats", self.nats.url, *args)
        return self.ui

    def stop(self) -> None:
        if self.ui is not None:
            self.ui.stop()
        self.ledger.kill()
        self.nats.stop()
