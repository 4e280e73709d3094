"""Attacks on the Iceberg tables themselves: someone with write access to the catalog and the warehouse
(not to the recorded chain heads) commits a snapshot that drops a file, points the catalog back at an
older metadata file, commits a stored file a second time, or commits a forged copy of one. The promise:
the views read whatever the catalog now says, and `verify`, which reads exactly those files, names what
was done (a gap, a chain cut short of its recorded head, an event stored twice, a changed value or a
broken link), so no such edit passes as a clean ledger.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from runledger import queries
from runledger.ledger.check.verify import verify
from runledger.ledger.contract.canonical import canonical_json, event_hash
from runledger.ledger.storage import paths
from runledger.ledger.storage.tables import Tables
from support.tables import BATCH, steps_all_counts, write_batches

BATCHES = 4  # one file of BATCH events each, committed one by one: run-1:worker-0:0 seq 0..27


def files_of(root: Path) -> list[Path]:
    return paths.event_files(root, "step", "run-1")  # in stream order: the chain's first events first


def drop_a_middle_file(root: Path) -> None:
    Tables(root).replace("step", [files_of(root)[1]], [])


def drop_the_last_file(root: Path) -> None:
    Tables(root).replace("step", [files_of(root)[-1]], [])


def roll_the_catalog_back(root: Path) -> None:
    """The catalog's pointer set to the table's metadata before the last commit (one SQL statement)."""
    with sqlite3.connect(root / "catalog.db") as con:
        con.execute("update iceberg_tables set metadata_location = previous_metadata_location "
                    "where table_name = 'step'")


def commit_a_file_twice(root: Path) -> None:
    Tables(root).commit({"step": [files_of(root)[1]]})


def _forge(root: Path, edit) -> None:
    """A copy of the third file with `edit` applied to its rows, committed in the original's place."""
    original = files_of(root)[2]
    rows = pq.read_table(original)
    forged = original.with_name("part-000000000015-000000000021-f0f0f0f0.parquet")
    pq.write_table(edit(rows), forged)
    Tables(root).replace("step", [original], [forged])


def change_a_typed_column(root: Path) -> None:
    _forge(root, lambda t: t.set_column(t.schema.get_field_index("loss"), "loss", pc.multiply(t["loss"], 0.5)))


def rewrite_an_event_and_its_hash(root: Path) -> None:
    """The first event of the file gets a new loss in its payload and column, and a hash recomputed to
    match: the event alone checks out, and the next event's prev_hash no longer links to it."""

    def edit(t: pa.Table) -> pa.Table:
        rows = t.to_pylist()
        env = rows[0]
        payload = json.loads(env["payload"])
        payload["loss"] = 0.125
        env["payload"] = canonical_json(payload)
        env["loss"] = 0.125
        env["hash"] = event_hash(env, env["payload"])
        return pa.Table.from_pylist(rows, schema=t.schema)

    _forge(root, edit)


ATTACKS = {
    "a commit drops a file from the middle of a chain": (drop_a_middle_file, 3 * BATCH, "missing: seq 7..13"),
    "a commit drops the chain's last file": (drop_the_last_file, 3 * BATCH, "cut short"),
    "the catalog points back at older metadata": (roll_the_catalog_back, 3 * BATCH, "cut short"),
    "a stored file is committed a second time": (commit_a_file_twice, 5 * BATCH, "stored 2 times"),
    "a forged copy changes a typed column": (change_a_typed_column, 4 * BATCH, "but the payload says"),
    "a forged copy rewrites an event and its hash": (rewrite_an_event_and_its_hash, 4 * BATCH,
                                                      "0:15: prev_hash does not match the hash of seq 14"),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_an_edit_of_the_tables_is_named_by_verify(root, attack):
    write_batches(root, BATCHES)
    assert verify(root).ok
    edit, rows_seen, named = ATTACKS[attack]
    edit(root)
    assert steps_all_counts(queries.connect(root))[0] == rows_seen  # the views read what the catalog now says
    report = verify(root)
    assert not report.ok
    assert any(named in p for p in report.problems), report.problems
