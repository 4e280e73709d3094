"""Shared fixtures: a real nats-server on a free loopback port in a temp dir, and ledger roots; the
CLI run in-process (`cli`) or as a user runs it (`runledger`); and the test tiers.

Integration tests talk to real JetStream and real DuckDB; nothing here is mocked. A test is marked
`slow` (left out by `make test-fast`, run by `make test`) from what it uses: a fixture that starts a
server, a process or a browser (SLOW_FIXTURES, directly or through another fixture), or what its own
body or one of its fixtures' bodies calls (SLOW_NAMES: processes, servers, training, JAX programs,
whole synthetic runs); and every property test (Hypothesis), which runs hundreds of examples. The
fast tier keeps their deterministic neighbours (golden vectors, fixed cases). Nothing is listed by file.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runledger.ledger.bus.natsserver import NatsServer

REPO = Path(__file__).resolve().parent.parent

# fixtures that start a server, a child process or a browser; a fixture built on one is caught through
# pytest's closure of fixture names, and one that starts them itself by the names its body uses
SLOW_FIXTURES = frozenset({"nats_server", "ledger_process", "chromium", "local_root", "cluster"})
# names that, used in a test's or a fixture's own body, make it slow: a child process or a server
# (runledger, subprocess, Popen, NatsServer, LedgerProcess, natsserver.up), a training run (the
# worker's train), a JAX program compiled (jax, jit), whole synthetic runs (audit_ledger.write_run),
# a property test run inside it (given)
SLOW_NAMES = frozenset({"runledger", "subprocess", "Popen", "NatsServer", "LedgerProcess", "up",
                        "train", "jax", "jit", "write_run", "given"})


def _calls_something_slow(func) -> bool:
    code = getattr(func, "__code__", None)
    return code is not None and bool(SLOW_NAMES & set(code.co_names))


def pytest_collection_modifyitems(config, items):
    """Mark `slow` each test that starts a server, a child process or a browser, trains, compiles JAX
    or builds whole runs, itself or through a fixture, and each property test (Hypothesis: hundreds
    of examples each): `make test-fast` runs `-m "not slow"`, `make test` everything."""
    for item in items:
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        fixtures = [d.func for name in getattr(item, "fixturenames", ()) for d in defs.get(name, ())]
        function = getattr(item, "function", None)
        if (SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or _calls_something_slow(function)
                or any(_calls_something_slow(f) for f in fixtures) or getattr(function, "is_hypothesis_test", False)):
            item.add_marker(pytest.mark.slow)


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


@pytest.fixture
def local_root(tmp_path, monkeypatch):
    """A root for `runledger.init`'s embedded local server and ledger (no NATS configured), which are
    stopped after the test."""
    from runledger.ledger import local

    r = tmp_path / "local-root"
    for var in ("RUNLEDGER_NATS", "RUNLEDGER_CREDS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RUNLEDGER_ROOT", str(r))
    yield r
    local.down(r)


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
    """`queries.connect(root)` anew for each query: the current snapshot of a root a live ledger writes."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def execute(self, sql: str, params: list | None = None) -> _Fetched:
        from runledger import queries

        con = queries.connect(self.root)
        return _Fetched((con.execute(sql, params) if params is not None else con.execute(sql)).fetchall())


def reader(root: Path) -> Reader:
    return Reader(root)


def wait_for_count(root: Path, sql: str, expected: int, timeout: float = 120) -> int:
    """Poll a count query over the ledger until it reaches `expected` (or time runs out)."""
    from runledger import queries

    deadline = time.monotonic() + timeout
    n = -1
    while time.monotonic() < deadline:
        n = queries.connect(root).execute(sql).fetchone()[0]
        if n >= expected:
            return n
        time.sleep(0.2)
    return n
