"""The ledger as Iceberg tables: readers see one snapshot (never a vanished file, never a row twice),
files no commit took are read by no one, compaction and expiry keep readers whole, a root of the
layout of before the tables is refused, a moved root reads and writes, and Polars and Daft read the same tables without runledger."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from runledger import queries
from runledger.ledger.check.verify import verify
from runledger.ledger.storage import paths
from runledger.ledger.storage import tables as tables_module
from runledger.ledger.storage.compaction import compact_partition
from runledger.ledger.storage.files import partition_dir
from runledger.ledger.storage.tables import Tables
from support.batches import batch_for
from support.runs import Producer
from support.tables import iceberg_table, steps_all_counts, write_batches

os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")  # (polars' own planner is a separate package)


def test_a_reader_keeps_its_snapshot_through_compaction_and_expiry(root):
    p = write_batches(root, 20)
    con = queries.connect(root)
    part = partition_dir(root, "step", "run-1")
    held = paths.event_files(root, "step", "run-1")
    assert compact_partition(part, min_files=4) is not None
    write_batches(root, 1, p, first=20)
    assert steps_all_counts(con) == (140, 140)  # its snapshot: the 20 small files, still on disk
    assert all(f.exists() for f in held)
    tables = Tables(root)
    assert tables.expire(keep=1) > 0  # only the newest snapshot is kept ...
    assert tables.sweep() == 0  # ... but what the others held waits RETENTION_S for their readers
    assert paths.uncommitted_files(root) == []  # (waiting in the graveyard: not an orphan to remove)
    assert all(f.exists() for f in held) and steps_all_counts(con) == (140, 140)
    queries.refresh(con, root)
    assert steps_all_counts(con) == (147, 147)  # the next snapshot: the compacted file and the new one
    assert tables.sweep(now=time.time() + tables_module.RETENTION_S + 1) >= len(held)  # later: they go
    assert not any(f.exists() for f in held)
    assert steps_all_counts(queries.connect(root)) == (147, 147) and verify(root).ok
    assert paths.uncommitted_files(root) == [] and tables.remove_orphans() == 0


def test_files_no_commit_took_are_read_by_no_one_and_removed_at_recovery(root):
    from runledger.ledger.ingest import service

    write_batches(root, 2)
    ledger = service.Ledger(root)

    later = [(subject, data, sseq + 100) for subject, data, sseq in batch_for(["run-x"], 5)]  # (past the stored seqs)
    ledger.write(ledger.decode(later))  # written, never committed: the ledger died here
    orphan = paths.event_files(root, "step", "run-x") or list(partition_dir(root, "step", "run-x").glob("*.parquet"))
    assert len(orphan) == 1 and orphan[0].exists()
    assert steps_all_counts(queries.connect(root)) == (14, 14)
    assert paths.event_files(root, "step", "run-x") == []
    report = verify(root)
    assert report.ok, report.problems  # an uncommitted file is no problem of the ledger's: nobody reads it
    again = service.Ledger(root)  # a restart: recovery removes it, and the stored set comes from the snapshot
    assert not orphan[0].exists()
    assert ("run-x", "worker-0", 0, 0) not in again.index


def test_a_copied_root_reads_where_it_is_and_a_writer_registers_it_there(root, tmp_path):
    p = write_batches(root, 3)
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    assert steps_all_counts(queries.connect(copy)) == (21, 21)
    assert all(str(f).startswith(str(copy)) for f in paths.event_files(copy))
    assert verify(copy).ok
    write_batches(copy, 1, p, first=3)  # a writer on the copy: its tables are registered anew here
    assert steps_all_counts(queries.connect(copy)) == (28, 28) and verify(copy).ok
    assert steps_all_counts(queries.connect(root)) == (21, 21) and verify(root).ok  # the original is untouched


def test_polars_and_daft_read_the_same_tables_as_the_views(root):
    pl = pytest.importorskip("polars")
    daft = pytest.importorskip("daft")
    p = write_batches(root, 4)
    write_batches(root, 2, Producer(run_id="run-2"))
    compact_partition(partition_dir(root, "step", "run-1"), min_files=2)
    sql = "select run_id, count(*), sum(loss), max(seq) from steps_all group by run_id order by run_id"
    views = queries.connect(root).execute(sql).fetchall()
    polars = (pl.scan_iceberg(iceberg_table(root)).group_by("run_id").agg(pl.len(), pl.col("loss").sum(), pl.col("seq").max())
              .sort("run_id").collect().rows())
    df = daft.read_iceberg(iceberg_table(root)).groupby("run_id").agg(
        daft.col("event_id").count(), daft.col("loss").sum(), daft.col("seq").max()).sort("run_id").to_pydict()
    daft_rows = list(zip(df["run_id"], df["event_id"], df["loss"], df["seq"]))
    assert views == [("run-1", 28, sum(range(28)), 27), ("run-2", 14, sum(range(14)), 13)]
    assert [tuple(r) for r in polars] == views
    assert daft_rows == views
    del p


def test_verify_and_replay_name_a_snapshot_and_verify_names_a_deleted_file(root):
    from support.processes import cli

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
    assert steps_all_counts(queries.connect(root)) == (28, 28)  # the views read what is there; verify names what is not


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


def test_a_root_written_before_runs_had_names_takes_named_runs_and_still_verifies(tmp_path, monkeypatch):
    """A field the contract gained (run_started.name, group, job_type, notes): the older files lack its
    column, the table gains it when a new run brings it, the views read the old rows' name as their id,
    and verify passes both (the older payloads lack the field)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from support.audit_ledger import T0, Ledger

    from runledger.ledger.storage import rows as stored_rows

    new_fields = ("name", "group", "job_type", "notes")
    root = tmp_path / "root"
    led = Ledger(root)
    with monkeypatch.context() as older:  # the writer as it was before the fields
        older.setitem(stored_rows._COLUMNS, "run_started",
                      {k: v for k, v in stored_rows._COLUMNS["run_started"].items() if k not in new_fields})
        struct = stored_rows._TYPED_STRUCT["run_started"]
        older.setitem(stored_rows._TYPED_STRUCT, "run_started", pa.struct([f for f in struct if f.name not in new_fields]))
        stored_rows.arrow_schema.cache_clear()  # (cached: the schema of the fields above)
        try:
            led.emit("old-run", "run_started", {"config": {}, "config_hash": "0" * 64, "project": "p"}, 0, T0)
            led.write()
        finally:
            stored_rows.arrow_schema.cache_clear()
    assert not set(new_fields) & set(pq.read_schema(next(root.glob("**/run_id=old-run/*.parquet"))).names)
    led.emit("new-run-abcd1234", "run_started", {"config": {}, "config_hash": "0" * 64, "project": "p", "name": "Old Run",
                                                 "group": "g"}, 0, T0)
    led.emit("old-run", "run_started", {"config": {}, "config_hash": "0" * 64, "project": "p"}, 0, T0, attempt=1)
    led.write()
    con = queries.connect(root)
    assert sorted(con.execute('select run_id, attempt, name, "group" from runs').fetchall()) == [
        ("new-run-abcd1234", 0, "Old Run", "g"), ("old-run", 0, "old-run", None), ("old-run", 1, "old-run", None)]
    report = verify(root)
    assert report.ok, report.text()
