"""Attacks on what `verify` and the readers promise (issue 33): that two starts of one run never share a
chain, that the table other engines read is the table `verify` verified, and that a folder that is not
a ledger is refused rather than answered with nothing.

Each test acts as the attacker or the careless user: two real processes racing to resume one run, a
delete file or a forged manifest committed with pyiceberg's own writers, a catalog deleted by hand, a
reader pointed at a folder of documents. Then it asserts the promise.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runledger.ledger.emit.sink import ParquetSink
from runledger.ledger.storage import paths, store
from runledger.ledger.storage.recovery import recover
from runledger.ledger.storage.tables import Tables
from runledger.tools.produce import step_payload
from support import REPO
from support.processes import cli
from support.reading import reader

WATCHDOG_S = 240  # a child that has not finished by then is killed (not a timing assert)

RACER = """
    import os, sys, time, runledger
    barrier, me = sys.argv[1], sys.argv[2]
    open(f"{barrier}.{me}", "w").close()
    while not (os.path.exists(f"{barrier}.a") and os.path.exists(f"{barrier}.b")):
        time.sleep(0.001)
    run = runledger.init(id="r", resume=True, system_metrics=False)
    for i in range(50):
        runledger.log({"x": float(i)})
    assert run.finish()
    print(run.attempt)
"""


def test_two_processes_resuming_one_run_at_once_get_two_attempts(local_root, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RUNLEDGER_NATS", "RUNLEDGER_CREDS")}
    env.update(RUNLEDGER_ROOT=str(local_root), PYTHONPATH=str(REPO))
    barrier = tmp_path / "barrier"
    racers = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(RACER), str(barrier), me], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for me in "ab"]
    attempts = []
    for racer in racers:
        try:
            out, err = racer.communicate(timeout=WATCHDOG_S)
        except subprocess.TimeoutExpired:
            racer.kill()
            raise
        assert racer.returncode == 0, err[-2000:]
        attempts.append(int(out.split()[-1]))
    assert sorted(attempts) == [0, 1]
    db = reader(local_root)
    per_attempt = db.execute("select attempt, count(*), count(distinct step) from metrics_all where run_id = 'r' "
                             "and key = 'x' group by attempt order by attempt").fetchall()
    assert per_attempt == [(0, 50, 50), (1, 50, 50)]  # every step stored once per attempt
    starts = db.execute("select attempt, count(*) from events where run_id = 'r' and kind = 'run_started' "
                        "group by attempt order by attempt").fetchall()
    assert starts == [(0, 1), (1, 1)]
    assert cli("verify", "--root", str(local_root)).returncode == 0


def test_a_chain_holding_two_run_started_is_named_by_verify(root):
    """A chain sealed and linked properly, but started twice (what two starts of one attempt made)."""
    with ParquetSink(root, "r", "main", 0) as sink:
        for _ in range(2):
            sink.emit_dict("run_started", {"config": {}, "config_hash": "0" * 64}, None)
            for i in range(3):
                sink.emit_dict("step", step_payload(i), step=i)
    report = cli("verify", "--root", str(root))
    assert report.returncode == 1, report.stdout
    assert "chain r:main:0 holds 2 run_started events (seqs 0, 4)" in report.stdout


# --------------------------------------------------------------------------------------------
# Delete files and manifests that other engines read differently
# --------------------------------------------------------------------------------------------


def _ledger_of_steps(root: Path, n: int = 5) -> Path:
    with ParquetSink(root, "run-1") as sink:
        for i in range(n):
            sink.emit_dict("step", step_payload(i), step=i)
    return paths.event_files(root, "step", "run-1")[0]


def _commit_delete_file(root: Path, content: str) -> Path:
    """Commit, with pyiceberg's own manifest writer, a delete file (positions, or equality on seq) that
    removes the first stored step from what Iceberg engines read."""
    from pyiceberg.manifest import (
        DataFile,
        DataFileContent,
        FileFormat,
        ManifestContent,
        ManifestEntry,
        ManifestEntryStatus,
        ManifestWriterV2,
    )
    from pyiceberg.table.snapshots import Operation
    from pyiceberg.table.update.snapshot import _FastAppendFiles
    from pyiceberg.typedef import Record

    table = Tables(root).table("step")
    data = paths.event_files(root, "step", "run-1")[0]
    deletes = data.with_name(f"delete-{content}.parquet")
    if content == "position":
        fields = [pa.field("file_path", pa.string(), False, {b"PARQUET:field_id": b"2147483546"}),
                  pa.field("pos", pa.int64(), False, {b"PARQUET:field_id": b"2147483545"})]
        pq.write_table(pa.table([pa.array([str(data)]), pa.array([0], pa.int64())], schema=pa.schema(fields)), deletes)
        kind, ids = DataFileContent.POSITION_DELETES, None
    else:
        seq_id = table.schema().find_field("seq").field_id
        field = pa.field("seq", pa.int64(), False, {b"PARQUET:field_id": str(seq_id).encode()})
        pq.write_table(pa.table([pa.array([0], pa.int64())], schema=pa.schema([field])), deletes)
        kind, ids = DataFileContent.EQUALITY_DELETES, [seq_id]
    delete_file = DataFile.from_args(content=kind, file_path=str(deletes), file_format=FileFormat.PARQUET,
                                     partition=Record("run-1"), record_count=1, equality_ids=ids,
                                     file_size_in_bytes=deletes.stat().st_size)
    delete_file.spec_id = table.spec().spec_id

    class DeleteManifestWriter(ManifestWriterV2):
        def content(self):
            return ManifestContent.DELETES

        @property
        def _meta(self):
            return {**super()._meta, "content": "deletes"}

    class AddDeletes(_FastAppendFiles):
        def _manifests(self):
            writer = DeleteManifestWriter(self._transaction.table_metadata.spec(), self.schema(),
                                          self.new_manifest_output(), self._snapshot_id, self._compression)
            with writer:
                writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id,
                                                   data_file=delete_file))
            return [*super()._manifests(), writer.to_manifest_file()]

    with table.transaction() as tx:
        AddDeletes(operation=Operation.DELETE, transaction=tx, io=table.io,
                   snapshot_properties={"runledger.commit": "2"}).commit()
    return deletes


@pytest.mark.parametrize("content", ["position", "equality"])
def test_a_committed_delete_file_is_named_by_verify_and_refused_by_the_views(root, content):
    _ledger_of_steps(root)
    deletes = _commit_delete_file(root, content)
    if content == "position":  # another engine reads one row less than the ledger stored
        table = Tables(root).table("step")
        assert table.scan().to_arrow().num_rows == 4
    report = cli("verify", "--root", str(root))
    assert report.returncode == 1, report.stdout
    assert f"{deletes}: a {content} delete file in table step" in report.stdout
    answer = cli("sql", "--root", str(root), "select count(*) from steps_all")
    assert answer.returncode == 2 and answer.stdout == "", answer.stdout
    assert len(answer.stderr.strip().splitlines()) == 1 and "delete file" in answer.stderr


def test_a_manifest_whose_row_count_differs_from_its_file_is_named_by_verify(root):
    """The manifest says 4 rows where the file has 5: an engine that counts from the manifests (Trino,
    Spark's count pushdown) answers otherwise than one that reads the file."""
    from pyiceberg.manifest import DataFile
    from pyiceberg.table.snapshots import Operation
    from pyiceberg.table.update.snapshot import _OverwriteFiles

    data = _ledger_of_steps(root)
    table = Tables(root).table("step")
    with table.transaction() as tx:
        current = tx.table_metadata.current_snapshot()
        entry = next(e.data_file for m in current.manifests(table.io) for e in m.fetch_manifest_entry(table.io))
        with _OverwriteFiles(operation=Operation.OVERWRITE, transaction=tx, io=table.io,
                             snapshot_properties={"runledger.commit": "2"}) as ow:
            ow.delete_data_file(entry)
            miscounted = DataFile.from_args(content=entry.content, file_path=entry.file_path, file_format=entry.file_format,
                                            partition=entry.partition, record_count=4,
                                            file_size_in_bytes=entry.file_size_in_bytes)
            miscounted.spec_id = entry.spec_id
            ow.append_data_file(miscounted)
    report = cli("verify", "--root", str(root))
    assert report.returncode == 1, report.stdout
    assert f"{data}: the table's manifest says 4 rows, the file holds 5" in report.stdout


def test_a_file_whose_columns_carry_swapped_field_ids_is_named_by_verify(root):
    """Same rows, same values, same digest; but `loss` carries grad_norm's field id and back: Iceberg
    engines (matching by id) read each as the other, DuckDB (matching by name) does not."""
    original = _ledger_of_steps(root)
    rows = pq.read_table(original)
    ids = {f.name: f.metadata[b"PARQUET:field_id"] for f in rows.schema}
    swap = {"loss": ids["grad_norm"], "grad_norm": ids["loss"]}
    schema = pa.schema([f.with_metadata({b"PARQUET:field_id": swap.get(f.name, ids[f.name])}) for f in rows.schema],
                       metadata=rows.schema.metadata)
    forged = original.with_name(original.name.replace(".parquet", "-f.parquet"))
    pq.write_table(rows.cast(schema), forged)
    Tables(root).replace("step", [original], [forged])
    engine = Tables(root).table("step").scan().to_arrow()
    assert engine.column("grad_norm").to_pylist() == rows.column("loss").to_pylist()  # another engine's read
    report = cli("verify", "--root", str(root))
    assert report.returncode == 1, report.stdout
    assert f"{forged}: column 'loss' carries field id {int(ids['grad_norm'])}" in report.stdout


# --------------------------------------------------------------------------------------------
# Folders that are not a ledger
# --------------------------------------------------------------------------------------------


def _one_line_refusal(answer: subprocess.CompletedProcess, what: str) -> None:
    assert answer.returncode == 2, (answer.returncode, answer.stdout[-500:], answer.stderr[-500:])
    lines = answer.stderr.strip().splitlines()
    assert len(lines) == 1 and what in lines[0], answer.stderr[-1000:]


def test_a_root_whose_catalog_is_gone_is_refused_by_every_reader(root):
    _ledger_of_steps(root)
    (root / "catalog.db").unlink()
    for args in (["sql", "select count(*) from events"], ["verify"], ["replay", "run-1"], ["audit", "health", "run-1"],
                 ["lineage", "run-1"], ["status", "--nats", "nats://127.0.0.1:1"]):
        _one_line_refusal(cli(*args, "--root", str(root)), "catalog.db")


def test_a_ledger_on_a_root_whose_catalog_is_gone_refuses_rather_than_orphan_every_file(root):
    """A new empty catalog would hold none of the stored files: the ledger's recovery would remove them all."""
    data = _ledger_of_steps(root)
    (root / "catalog.db").unlink()
    store.forget_tables(root)
    with pytest.raises(ValueError, match="catalog.db is missing"):
        recover(root)
    assert data.exists() and not (root / "catalog.db").exists()


def test_a_root_whose_catalog_was_emptied_is_refused_by_every_reader(root):
    import sqlite3

    _ledger_of_steps(root)
    with sqlite3.connect(root / "catalog.db") as con:
        con.execute("drop table iceberg_tables")
    for args in (["sql", "select count(*) from events"], ["verify"], ["replay", "run-1"]):
        _one_line_refusal(cli(*args, "--root", str(root)), "holds no tables")


def test_a_folder_that_is_not_a_ledger_is_refused_by_every_reader():
    docs = str(REPO / "docs")
    for args in (["sql", "select count(*) from events"], ["verify"], ["lineage", "run-1"],
                 ["status", "--nats", "nats://127.0.0.1:1"]):
        _one_line_refusal(cli(*args, "--root", docs), "not a ledger root")
    for args in (["replay", "run-1"], ["audit", "health", "run-1"]):  # (they look for the run first)
        _one_line_refusal(cli(*args, "--root", docs), "run-1")


def test_a_new_root_that_a_ledger_made_still_answers_empty(root):
    Tables(root)  # what a ledger serving a new root makes before anything is stored
    answer = cli("sql", "--root", str(root), "select count(*) as n from events", "--format", "csv")
    assert answer.returncode == 0 and answer.stdout.split() == ["n", "0"], answer.stderr
    assert cli("verify", "--root", str(root)).returncode == 0
    empty = root.parent / "empty"
    empty.mkdir()  # a root a ledger is about to make (readers polling it while it starts)
    answer = cli("sql", "--root", str(empty), "select count(*) as n from events", "--format", "csv")
    assert answer.returncode == 0 and answer.stdout.split() == ["n", "0"], answer.stderr
