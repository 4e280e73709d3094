"""A shared catalog: two ledger instances commit one root's tables to one PostgreSQL catalog (a real
Debian `postgres`, started here), and the catalog server is killed mid-commit and started again.

The promises under attack: no event that JetStream acked to a producer is lost, none is stored twice
(a commit the dying server may or may not have taken is not repeated blindly), and two writers'
commits to one table that conflict are retried.
"""

from __future__ import annotations

import time
from pathlib import Path

from support.postgres import postgres  # noqa: F401 (a fixture)
from support.processes import LedgerProcess, cli, kill_all, start_producer
from support.reading import reader

RUNS = ["pga", "pgb", "pgc", "pgd"]  # over both partitions
PER_RUN = 4_000
RATE = 800  # events/s per producer: still publishing when the catalog dies


def stored_through_pg(root: Path, uri: str) -> tuple[int, int]:
    """(rows, distinct event_ids) of the step table, read through the PostgreSQL catalog."""
    import pyarrow.compute as pc

    from runledger.ledger.storage.tables import Tables

    t = Tables(root, uri=uri, mark=False).table("step")
    t.refresh()
    ids = t.scan(selected_fields=("event_id",)).to_arrow().column("event_id")
    return len(ids), len(pc.unique(ids))


def stored_or_none(root: Path, uri: str) -> int:
    """The step table's rows, or 0 while it is not made yet."""
    try:
        return stored_through_pg(root, uri)[0]
    except Exception:  # no table yet (or the catalog is being made)
        return 0


def test_two_ledgers_on_one_postgres_catalog_survive_its_crash_mid_commit(tmp_path, nats_server, postgres):
    root = tmp_path / "root"
    args = ("--partitions", "2", "--catalog", postgres.uri)
    ledgers = [LedgerProcess(root, nats_server.url, tmp_path / f"ledger-{i}.log", *args).start() for i in range(2)]
    producers = []
    try:
        producers = [start_producer(nats_server.url, tmp_path / "spool", run, "worker-0", PER_RUN, RATE) for run in RUNS]
        deadline = time.monotonic() + 60
        while stored_or_none(root, postgres.uri) < PER_RUN // 2:  # commits under way (every 0.2 s while busy)
            assert time.monotonic() < deadline, "nothing was stored"
            time.sleep(0.2)
        # ... and more to store when the catalog dies (whether the producers are still publishing or their events
        # wait in the stream depends on the machine's load; the ledgers meeting the crash is asserted below)
        assert stored_or_none(root, postgres.uri) < PER_RUN * len(RUNS)
        postgres.kill()
        time.sleep(2.0)  # the ledgers retry their commits, acking nothing
        postgres.start()
        for p in producers:
            assert p.wait(180) == 0, p.stderr.read()
        total = PER_RUN * len(RUNS)
        deadline = time.monotonic() + 120
        while stored_through_pg(root, postgres.uri)[0] < total and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1.0)  # anything doubled would come with the last commits
        assert stored_through_pg(root, postgres.uri) == (total, total)
        con = reader(root)  # readers (views, verify) list the tables in the shared catalog too
        assert con.execute("select count(*), count(distinct event_id) from steps").fetchone() == (total, total)
        assert con.execute("select count(*) from quarantine").fetchone()[0] == 0
        assert cli("verify", "--root", str(root)).returncode == 0
        logs = b"".join(lp.log_path.read_bytes() for lp in ledgers)
        # the crash was met mid-stream, and the commits (or the writes, which need the tables) waited it out
        assert b"cannot commit" in logs or b"the catalog is unavailable" in logs
        assert all(lp.proc.poll() is None for lp in ledgers)
    finally:
        kill_all(producers, ledgers)
