"""The ledger as Iceberg tables: readers see one snapshot (never a vanished file, never a row twice),
files no commit took are read by no one, compaction and expiry keep readers whole, a root of the
layout of before the tables is refused, a moved root reads and writes, and Polars and Daft read the same tables without runledger."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from runledger import queries
from runledger.ledger.check.verify import verify
from runledger.ledger.storage import paths, store
from runledger.ledger.storage import tables as tables_module
from runledger.ledger.storage.compaction import compact_partition
from runledger.ledger.storage.files import partition_dir
from runledger.ledger.storage.tables import Tables
from support import REPO
from support.tables import BATCH, iceberg_table, steps_all_counts, write_batches

os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")  # (polars' own planner is a separate package)


@pytest.mark.slow
def test_a_named_snapshot_reads_as_it_was(root, tmp_path):
    p = write_batches(root, 3)
    n = paths.cut(root).commit
    write_batches(root, 2, p, first=3)
    assert queries.query(root, "select count(*) from steps_all", snapshot=n)[1] == [(21,)]
    assert queries.query(root, "select count(*) from steps_all")[1] == [(35,)]
    out = subprocess.run([sys.executable, "-m", "runledger.tools.cli", "sql", "--root", str(root), "--snapshot", str(n), "--format",
                          "csv", "select count(*) from steps_all"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.splitlines()[1] == "21", out.stderr
    compact_partition(partition_dir(root, "step", "run-1"), min_files=2)
    Tables(root).expire(keep=1)
    with pytest.raises(paths.SnapshotGone, match=f"ledger snapshot {n} has expired"):
        queries.query(root, "select count(*) from steps_all", snapshot=n)


def test_a_root_of_the_layout_before_the_tables_is_refused_in_one_line(tmp_path):
    """Event files and no tables.json: the pre-Iceberg layout, which no reader or writer takes (a reader
    would see nothing, a writer would make tables beside files no snapshot holds)."""
    root = tmp_path / "old"
    write_batches(tmp_path / "new", 1)
    part = root / "events" / "kind=step" / "run_id=r"
    part.mkdir(parents=True)
    shutil.copyfile(paths.event_files(tmp_path / "new")[0], part / "part-000000000001-000000000007-0000.parquet")
    for command in (["sql", "select count(*) from steps_all"], ["verify"]):
        out = subprocess.run([str(REPO / ".venv" / "bin" / "runledger"), command[0], "--root", str(root), *command[1:]],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, (command, out.stderr)
        assert str(root) in out.stderr and "pre-Iceberg layout" in out.stderr and "no longer reads" in out.stderr
    from runledger.ledger.check.replay import replay_run
    from runledger.ledger.ingest.service import Ledger

    for entry in (queries.connect, verify, Ledger, store.tables_of, paths.event_files, paths.quarantine_files,
                  lambda r: replay_run(r, "r")):
        with pytest.raises(paths.NotALedger, match="pre-Iceberg layout"):
            entry(root)
    assert not (root / paths.MARKER).exists() and not (root / paths.CATALOG_FILE).exists()  # nothing made there


@pytest.mark.slow
def test_readers_in_a_loop_never_fail_while_the_ledger_writes_compacts_and_expires(root, monkeypatch):
    """Views, `runledger sql` in a child process, Polars and Daft, each in a loop, while a writer commits
    batches of 7, compacts, expires all snapshots but 2 and deletes their files after a 5-second
    retention: no read fails, and every count is a whole number of batches with no event twice (one
    snapshot, never a half-compacted state)."""
    monkeypatch.setattr(tables_module, "RETENTION_S", 5.0)
    pl = pytest.importorskip("polars")
    daft = pytest.importorskip("daft")
    p = write_batches(root, 2)
    stop = threading.Event()
    seen: dict[str, list] = {"views": [], "sql": [], "polars": [], "daft": []}
    errors: list[str] = []

    def writer() -> None:
        b = 2
        tables = Tables(root)
        try:
            while not stop.is_set() and b < 400:
                write_batches(root, 1, p, first=b)
                b += 1
                if b % 5 == 0:
                    compact_partition(partition_dir(root, "step", "run-1"), min_files=4)
                    tables.expire(keep=2)
                    tables.sweep()
        except Exception as err:  # noqa: BLE001 (reported below)
            errors.append(f"writer: {err!r}")

    def loop(name: str, read) -> None:
        while not stop.is_set():
            try:
                seen[name].append(read())
            except Exception as err:  # noqa: BLE001 (the test's point: none may happen)
                errors.append(f"{name}: {err!r}")
                return

    def views():
        return steps_all_counts(queries.connect(root))

    def sql():
        out = subprocess.run([sys.executable, "-m", "runledger.tools.cli", "sql", "--root", str(root), "--format", "csv",
                              "select count(*), count(distinct event_id) from steps_all"],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
        if out.returncode:
            raise RuntimeError(out.stderr.strip())
        return tuple(map(int, out.stdout.splitlines()[1].split(",")))

    def polars():
        t = pl.scan_iceberg(iceberg_table(root)).select(pl.len(), pl.col("event_id").n_unique()).collect()
        return tuple(t.row(0))

    def daft_():
        d = daft.read_iceberg(iceberg_table(root)).agg(daft.col("event_id").count().alias("n"),
                                                  daft.col("event_id").count_distinct().alias("d")).to_pydict()
        return d["n"][0], d["d"][0]

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=loop, args=(n, f)) for n, f in
                                                   (("views", views), ("sql", sql), ("polars", polars), ("daft", daft_))]
    for t in threads:
        t.start()
    time.sleep(25)
    stop.set()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for name, got in seen.items():
        assert got, f"{name} read nothing"
        for total, distinct in got:
            assert total == distinct and total % BATCH == 0, (name, total, distinct)
        assert [t for t, _ in got] == sorted(t for t, _ in got), name  # snapshots only move forward
    assert verify(root).ok
