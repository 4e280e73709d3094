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
from pathlib import Path

import pytest

from runledger import queries
from runledger.ledger.storage import paths, store
from runledger.ledger.storage import tables as tables_module
from runledger.ledger.storage.compaction import compact_partition
from runledger.ledger.storage.files import partition_dir
from runledger.ledger.storage.tables import Tables
from runledger.ledger.check.verify import verify
from tests.conftest import REPO
from tests.test_store import Producer, canonical, step_payload

os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")  # (polars' own planner is a separate package)
BATCH = 7  # events per commit in these tests: a snapshot's count is always a multiple of it


def write_batches(root: Path, n: int, producer: Producer | None = None, first: int = 0) -> Producer:
    p = producer or Producer()
    for b in range(first, first + n):
        store.write_events(root, [canonical(p.event("step", step_payload(float(s)), s, s + 1))
                                  for s in range(b * BATCH, (b + 1) * BATCH)])
    return p


def counts(con) -> tuple[int, int]:
    return con.execute("select count(*), count(distinct event_id) from steps_all").fetchone()


def test_a_reader_keeps_its_snapshot_through_compaction_and_expiry(root):
    p = write_batches(root, 20)
    con = queries.connect(root)
    part = partition_dir(root, "step", "run-1")
    held = paths.event_files(root, "step", "run-1")
    assert compact_partition(part, min_files=4) is not None
    write_batches(root, 1, p, first=20)
    assert counts(con) == (140, 140)  # its snapshot: the 20 small files, still on disk
    assert all(f.exists() for f in held)
    tables = Tables(root)
    assert tables.expire(keep=1) > 0  # only the newest snapshot is kept ...
    assert tables.sweep() == 0  # ... but what the others held waits RETENTION_S for their readers
    assert paths.uncommitted_files(root) == []  # (waiting in the graveyard: not an orphan to remove)
    assert all(f.exists() for f in held) and counts(con) == (140, 140)
    queries.refresh(con, root)
    assert counts(con) == (147, 147)  # the next snapshot: the compacted file and the new one
    assert tables.sweep(now=time.time() + tables_module.RETENTION_S + 1) >= len(held)  # later: they go
    assert not any(f.exists() for f in held)
    assert counts(queries.connect(root)) == (147, 147) and verify(root).ok
    assert paths.uncommitted_files(root) == [] and tables.remove_orphans() == 0


def test_files_no_commit_took_are_read_by_no_one_and_removed_at_recovery(root):
    from runledger.ledger.ingest import service

    write_batches(root, 2)
    ledger = service.Ledger(root)
    from tests.test_ledger_write import batch_for

    ledger.write(ledger.decode(batch_for(["run-x"], 5)))  # written, never committed: the ledger died here
    orphan = paths.event_files(root, "step", "run-x") or list(partition_dir(root, "step", "run-x").glob("*.parquet"))
    assert len(orphan) == 1 and orphan[0].exists()
    assert counts(queries.connect(root)) == (14, 14)
    assert paths.event_files(root, "step", "run-x") == []
    report = verify(root)
    assert report.ok, report.problems  # an uncommitted file is no problem of the ledger's: nobody reads it
    again = service.Ledger(root)  # a restart: recovery removes it, and the stored set comes from the snapshot
    assert not orphan[0].exists()
    assert ("run-x", "worker-0", 0, 0) not in again.index


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


def test_a_copied_root_reads_where_it_is_and_a_writer_registers_it_there(root, tmp_path):
    p = write_batches(root, 3)
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    assert counts(queries.connect(copy)) == (21, 21)
    assert all(str(f).startswith(str(copy)) for f in paths.event_files(copy))
    assert verify(copy).ok
    write_batches(copy, 1, p, first=3)  # a writer on the copy: its tables are registered anew here
    assert counts(queries.connect(copy)) == (28, 28) and verify(copy).ok
    assert counts(queries.connect(root)) == (21, 21) and verify(root).ok  # the original is untouched


def _engines(root: Path):
    """The step table through pyiceberg's own catalog: what a lab's tools use, no runledger code."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("runledger", uri=f"sqlite:///{root.resolve()}/catalog.db", warehouse=f"file://{root.resolve()}")
    return catalog.load_table("runledger.step")


def test_polars_and_daft_read_the_same_tables_as_the_views(root):
    pl = pytest.importorskip("polars")
    daft = pytest.importorskip("daft")
    p = write_batches(root, 4)
    write_batches(root, 2, Producer(run_id="run-2"))
    compact_partition(partition_dir(root, "step", "run-1"), min_files=2)
    sql = "select run_id, count(*), sum(loss), max(seq) from steps_all group by run_id order by run_id"
    views = queries.connect(root).execute(sql).fetchall()
    polars = (pl.scan_iceberg(_engines(root)).group_by("run_id").agg(pl.len(), pl.col("loss").sum(), pl.col("seq").max())
              .sort("run_id").collect().rows())
    df = daft.read_iceberg(_engines(root)).groupby("run_id").agg(
        daft.col("event_id").count(), daft.col("loss").sum(), daft.col("seq").max()).sort("run_id").to_pydict()
    daft_rows = list(zip(df["run_id"], df["event_id"], df["loss"], df["seq"]))
    assert views == [("run-1", 28, sum(range(28)), 27), ("run-2", 14, sum(range(14)), 13)]
    assert [tuple(r) for r in polars] == views
    assert daft_rows == views
    del p


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
        return counts(queries.connect(root))

    def sql():
        out = subprocess.run([sys.executable, "-m", "runledger.tools.cli", "sql", "--root", str(root), "--format", "csv",
                              "select count(*), count(distinct event_id) from steps_all"],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
        if out.returncode:
            raise RuntimeError(out.stderr.strip())
        return tuple(map(int, out.stdout.splitlines()[1].split(",")))

    def polars():
        t = pl.scan_iceberg(_engines(root)).select(pl.len(), pl.col("event_id").n_unique()).collect()
        return tuple(t.row(0))

    def daft_():
        d = daft.read_iceberg(_engines(root)).agg(daft.col("event_id").count().alias("n"),
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


def test_verify_and_replay_name_a_snapshot_and_verify_names_a_deleted_file(root):
    from tests.conftest import cli

    p = write_batches(root, 3)
    n = paths.cut(root).commit
    write_batches(root, 2, p, first=3)
    assert cli("verify", "--root", str(root), "--snapshot", str(n)).returncode == 0
    out = cli("replay", "run-1", "--root", str(root), "--snapshot", str(n), "--format", "json")
    assert out.returncode == 0 and '"events": 21' in out.stdout, out.stdout + out.stderr
    out = cli("replay", "run-1", "--root", str(root), "--format", "json")
    assert '"events": 35' in out.stdout
    gone = cli("verify", "--root", str(root), "--snapshot", "0")
    assert gone.returncode == 2 and "numbered from 1" in gone.stderr
    victim = paths.event_files(root, "step", "run-1")[1]
    victim.unlink()
    report = verify(root)
    assert f"{victim}: in the tables' snapshot, but not on disk (deleted?)" in report.problems
    assert counts(queries.connect(root)) == (28, 28)  # the views read what is there; verify names what is not


def test_a_table_is_partitioned_by_run_in_the_commit_that_makes_it(root):
    # Partitions' writers share the tables: one that loads a table another has just made must never see it
    # unpartitioned (its appends would name no run in the manifests). So the metadata that made the table
    # already holds the run_id spec, and no later commit changes the spec.
    write_batches(root, 1)
    t = Tables(root).table("step")
    assert [f.name for f in t.spec().fields] == ["run_id"]
    from pyiceberg.serializers import FromInputFile

    first = t.metadata.metadata_log[0].metadata_file if t.metadata.metadata_log else t.metadata_location
    made = FromInputFile.table_metadata(t.io.new_input(first))
    assert [s.spec_id for s in made.partition_specs] == [made.default_spec_id] == [t.spec().spec_id]
    assert [f.name for f in made.spec().fields] == ["run_id"]
    assert {e.data_file.partition[0] for m in t.current_snapshot().manifests(t.io)
            for e in m.fetch_manifest_entry(t.io)} == {"run-1"}
