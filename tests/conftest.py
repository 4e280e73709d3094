"""Shared fixtures: a real nats-server on a free loopback port in a temp dir, and ledger roots.

Integration tests talk to real JetStream and real DuckDB; nothing here is mocked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from ledger.natsserver import NatsServer

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def nats_server(tmp_path):
    server = NatsServer(tmp_path / "nats").start()
    yield server
    server.stop()


@pytest.fixture
def root(tmp_path) -> Path:
    r = tmp_path / "ledger"
    r.mkdir()
    return r


def runledger(*args: str, input: str | None = None, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "tools.cli", *args], input=input, capture_output=True, text=True,
        timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})},
    )


class LedgerProcess:
    """`runledger ledger serve` as a child process that a test can SIGKILL and restart."""

    def __init__(self, root: Path, nats_url: str, log_path: Path, *args: str):
        self.root, self.nats_url, self.log_path, self.args = root, nats_url, log_path, args
        self.proc: subprocess.Popen | None = None

    def start(self) -> "LedgerProcess":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tools.cli", "ledger", "serve", "--root", str(self.root), "--nats", self.nats_url, *self.args],
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


@pytest.fixture
def ledger_process(tmp_path, nats_server, root):
    lp = LedgerProcess(root, nats_server.url, tmp_path / "ledger.log")
    yield lp
    lp.kill()


class _Fetched:
    def __init__(self, rows: list[tuple]) -> None:
        self.rows = rows

    def fetchone(self) -> tuple | None:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[tuple]:
        return self.rows


class Reader:
    """`queries.connect(root)` for a root that a live ledger writes and compacts: a query that meets a
    file compacted away between the listing and the read is asked again on a fresh connection. (The
    race is real for every reader of today's plain-Parquet layout: issue 17's table snapshots end it.)"""

    def __init__(self, root: Path) -> None:
        self.root = root

    def execute(self, sql: str, params: list | None = None) -> _Fetched:
        import queries

        for attempt in range(50):
            try:
                con = queries.connect(self.root)
                return _Fetched((con.execute(sql, params) if params is not None else con.execute(sql)).fetchall())
            except duckdb.IOException:
                if attempt == 49:
                    raise
                time.sleep(0.05)
        raise AssertionError("unreachable")


def reader(root: Path) -> Reader:
    return Reader(root)


def wait_for_count(root: Path, sql: str, expected: int, timeout: float = 120) -> int:
    """Poll a count query over the ledger until it reaches `expected` (or time runs out)."""
    import queries

    deadline = time.monotonic() + timeout
    n = -1
    while time.monotonic() < deadline:
        try:
            n = queries.connect(root).execute(sql).fetchone()[0]
        except duckdb.IOException:  # a file compacted away between listing and reading: ask again
            continue
        if n >= expected:
            return n
        time.sleep(0.2)
    return n
