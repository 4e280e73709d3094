"""The fixtures every tier shares: a real nats-server on a free loopback port in a temp dir, a ledger
root, `runledger.init`'s embedded local default, and `runledger ledger serve` as a child process.

The tests are in folders by tier (make test-fast runs the linter and tests/unit; make test, all):
- unit/: no server, no child process, no browser, no JAX program (tests/unit/conftest.py refuses them);
- integration/: real nats-server, ledger, agents and notify processes, JAX training, whole ledgers;
- attacks/: each promise attacked as the attacking role, or by editing the stored files;
- e2e/: the demo, chaos, the browser, clusters, PostgreSQL, a fresh install, the docs' code blocks.
Helpers live once in tests/support/. Nothing here is mocked.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# a run's finish hands its events to the root's supervisor; the commands that read the root (and the
# tests' readers, support.reading) wait for them: on a loaded 2-core machine, longer than a user would
os.environ.setdefault("RUNLEDGER_STORE_WAIT_S", "60")

import pytest

from runledger.ledger.bus.natsserver import NatsServer
from support.processes import LedgerProcess

# the module- and session-wide fixtures run before `user_data`: they too keep out of the real user's
# folders (a transparency log's key made in ~/.config would sign every root those fixtures make)
_SESSION_HOME = tempfile.mkdtemp(prefix="runledger-test-home-")
for _var, _sub in (("XDG_DATA_HOME", "data"), ("XDG_CONFIG_HOME", "config"), ("XDG_STATE_HOME", "state")):
    os.environ[_var] = os.path.join(_SESSION_HOME, _sub)
os.environ["RUNLEDGER_ROOT"] = os.path.join(_SESSION_HOME, "data", "runledger")


@pytest.fixture(autouse=True)
def user_data(tmp_path_factory, monkeypatch) -> Path:
    """No test writes into the real user's data folder (the default root, `runledger.ledger.settings.user_root`):
    each test's $RUNLEDGER_ROOT and $XDG_DATA_HOME (its processes inherit them) are a folder of its own."""
    home = tmp_path_factory.mktemp("user-data")
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    monkeypatch.setenv("RUNLEDGER_ROOT", str(home / "runledger"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))  # (the transparency log's key: runledger.ledger.tlog)
    monkeypatch.setenv("XDG_STATE_HOME", str(home / "state"))  # (the tlog audit's checkpoints seen)
    return home


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


@pytest.fixture
def ledger_process(tmp_path, nats_server, root):
    lp = LedgerProcess(root, nats_server.url, tmp_path / "ledger.log")
    yield lp
    lp.kill()




@pytest.fixture
def warnings_said(caplog):
    """The `runledger` logger's warnings, as a function (runledger.wandb_compat warns once per name per
    process: its record is cleared before and after)."""
    import logging

    from runledger import wandb_compat

    wandb_compat.WARNED.clear()
    caplog.set_level(logging.WARNING, logger="runledger")
    yield lambda: [r.getMessage() for r in caplog.records if r.name == "runledger" and r.levelno == logging.WARNING]
    wandb_compat.WARNED.clear()
