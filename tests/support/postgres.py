"""postgres: shared by the tests (tests/support: every helper defined once)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from runledger.ledger.bus.natsserver import free_port


class Postgres:
    """A throwaway PostgreSQL server in a temp dir, on a free loopback port, run as `nobody` (initdb
    refuses root); trust authentication on loopback only."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="runledger-pg-"))
        self.port = free_port()
        os.chmod(self.dir, 0o755)
        shutil.chown(self.dir, "nobody")
        self.data = self.dir / "data"
        self._as_user(PG_BIN / "initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync")

    @property
    def uri(self) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"

    def _as_user(self, *cmd) -> None:
        prefix = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *map(str, cmd)], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self._as_user(PG_BIN / "pg_ctl", "-D", self.data, "-l", self.dir / "pg.log", "-w", "-t", "60", "start", "-o",
                      f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off")

    def kill(self) -> None:
        """Immediate shutdown: every backend is killed mid-transaction, nothing is checkpointed, and the
        next start recovers from the WAL, as after a crash."""
        self._as_user(PG_BIN / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        try:
            self._as_user(PG_BIN / "pg_ctl", "-D", self.data, "-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


PG_BIN = Path("/usr/lib/postgresql/15/bin")


@pytest.fixture
def postgres():
    """A throwaway PostgreSQL server for one test (skipped where Debian's server binaries are not installed)."""
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"no PostgreSQL server binaries at {PG_BIN} (Debian's postgresql-15)")
    pg = Postgres()
    pg.start()
    yield pg
    pg.stop()
