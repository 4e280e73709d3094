"""The CLI and the ledger as a user runs them: in a subprocess (`runledger`), in this process (`cli`),
and `runledger ledger serve` as a child process a test can kill and restart (`LedgerProcess`)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from support import REPO


def runledger(*args: str, input: str | None = None, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would (for what only a process shows: its start-up,
    its exit under a signal, servers it leaves running, bytes on its stdin)."""
    return subprocess.run(
        [sys.executable, "-m", "runledger.tools.cli", *args], input=input, capture_output=True, text=True,
        timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})},
    )


def cli(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    """Run the CLI in this process (`runledger.tools.cli.main`), with what it prints and logs captured: the same
    answer as `runledger(...)` without a new interpreter, where the process itself is not under test."""
    from runledger.tools.cli import main

    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))  # as main's
    root_logger = logging.getLogger()
    level = root_logger.level
    root_logger.addHandler(handler)
    root_logger.setLevel(logging.INFO)
    stdin = sys.stdin
    sys.stdin = io.StringIO(input or "")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exit_:  # argparse's usage errors
                code = exit_.code if isinstance(exit_.code, int) else 2
    finally:
        sys.stdin = stdin
        root_logger.removeHandler(handler)
        root_logger.setLevel(level)
    return subprocess.CompletedProcess(["runledger", *args], code, out.getvalue(), err.getvalue())


class LedgerProcess:
    """`runledger ledger serve` as a child process that a test can SIGKILL and restart."""

    def __init__(self, root: Path, nats_url: str, log_path: Path, *args: str):
        self.root, self.nats_url, self.log_path, self.args = root, nats_url, log_path, args
        self.proc: subprocess.Popen | None = None

    def start(self) -> "LedgerProcess":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runledger.tools.cli", "ledger", "serve", "--root", str(self.root), "--nats", self.nats_url, *self.args],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        )
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def terminate(self, timeout: float = 30) -> int:
        self.proc.terminate()
        return self.proc.wait(timeout)


def verify(root: Path, *extra: str) -> tuple[int, str]:
    r = cli("verify", "--root", str(root), *extra)
    return r.returncode, r.stdout + r.stderr


def wait_serving(lp: LedgerProcess, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while b"ledger serving" not in lp.log_path.read_bytes():
        assert time.monotonic() < deadline and lp.proc.poll() is None, lp.log_path.read_text()
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_producer(nats_url, spool, run_id, producer, count, rate=0.0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "runledger.tools.produce", "--nats", nats_url, "--spool", str(spool), "--run-id", run_id,
         "--producer", producer, "--count", str(count), "--rate", str(rate)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def kill_all(producers: list[subprocess.Popen], ledgers: list[LedgerProcess]) -> None:
    """A test's end, however it ended: the producers still running and every ledger process killed."""
    for p in producers:
        if p.poll() is None:
            p.kill()
    for lp in ledgers:
        lp.kill()


class WitnessProcess:
    """`runledger witness serve` as a child process, on a port it keeps across restarts (its log in
    `witness.log`), with a key made for it once."""

    def __init__(self, tmp: Path, log_vkey: str, port: int = 0) -> None:
        self.state, self.key, self.log_vkey, self.port = tmp / "witness-state", tmp / "keys" / "witness.key", log_vkey, port
        self.log_path = tmp / "witness.log"
        if not self.key.exists():
            assert cli("witness", "keygen", "--name", "witness.test/w1", "--out", str(self.key)).returncode == 0
        self.vkey = cli("witness", "key", "--key", str(self.key)).stdout.strip()
        self.proc: subprocess.Popen | None = None

    def start(self) -> "WitnessProcess":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runledger.tools.cli", "witness", "serve", "--port", str(self.port), "--state",
             str(self.state), "--key", str(self.key), "--log-key", self.log_vkey],
            cwd=REPO, stdout=subprocess.PIPE, stderr=open(self.log_path, "ab"), text=True)
        line = self.proc.stdout.readline()  # its URL, once it serves
        assert line.startswith("http://127.0.0.1:"), self.log_path.read_text()
        self.url = line.strip()
        self.port = int(self.url.rsplit(":", 1)[1].strip("/"))
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            assert self.proc.wait(timeout=60) == 0
