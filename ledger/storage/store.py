"""The ledger's writer: validated events and refused input made durable, one new file per (kind, run)
and commit, under one root.

Layout (DESIGN.md, Storage):
    {root}/events/kind={kind}/run_id={run_id}/part-{first}-{last}-{tag}.parquet
    {root}/quarantine/part-{first}-{last}-{tag}.parquet
A root keeps these files as Apache Iceberg tables (`runledger.ledger.storage.tables`, one per kind and one of the
quarantine): a file is read once a commit puts it in the table's snapshot. A root in the layout of
before the tables (`paths.is_old`) is refused (`paths.NotALedger`: `Tables` refuses it).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from runledger.ledger.contract.metricnames import metric_column, narrow_column
from runledger.ledger.storage import heads
from runledger.ledger.storage.digest import with_digest
from runledger.ledger.storage.files import file_name, partition_dir, write_atomic
from runledger.ledger.storage.paths import QUARANTINE
from runledger.ledger.storage.reads import stored_heads
from runledger.ledger.storage.rows import QUARANTINE_SCHEMA, TIMESTAMP, Rows, StoredEvent, events_table, group_events, wide_fields

if TYPE_CHECKING:
    from runledger.ledger.storage.tables import Tables

log = logging.getLogger(__name__)

_TABLES: dict[Path, "Tables"] = {}


def tables_of(root: Path) -> "Tables":
    """The writer's handle on a root's tables (made on first use: a new root gets tables); raises
    paths.NotALedger for a root in the layout of before the tables (`paths.refuse_old`)."""
    root = Path(root).resolve()
    if root not in _TABLES:
        from runledger.ledger.storage.tables import Tables

        _TABLES[root] = Tables(root)
    return _TABLES[root]


def use_tables(root: Path, tables: "Tables") -> None:
    """Make `tables` the writer's handle on `root` (tables in a shared catalog: `tables_of` then returns it)."""
    _TABLES[Path(root).resolve()] = tables


def forget_tables(root: Path) -> None:
    """Drop the cached handle (a test that rebuilds a root in place)."""
    _TABLES.pop(Path(root).resolve(), None)


def write_group(root: Path, kind: str, run_id: str, group: list[StoredEvent] | Rows, ingested_at: datetime,
                tables: "Tables | None" = None) -> Path:
    """Durably write one partition's events as one new file (with the field ids of `tables`, default the
    root's: `tables_of`), for a commit to follow; return it."""
    tables = tables or tables_of(root)
    rows = group if isinstance(group, Rows) else Rows.of(group)
    path = partition_dir(tables.base, kind, run_id) / file_name("part", rows.stream_seqs)
    stored = None
    if wide_fields(kind):  # which names get a column of their own: the table's bound
        wanted = {}
        for field_name in wide_fields(kind):
            for env in rows.envs:
                wanted.update(dict.fromkeys(metric_column(field_name, n) for n in env["payload"].get(field_name) or ()))
        stored = tables.wide_columns_for(kind, run_id, list(wanted))
        if len(stored) < len(wanted):
            stored |= {narrow_column(f) for f in wide_fields(kind)}
    table = with_digest(events_table(kind, rows, ingested_at, stored))
    write_atomic(tables.with_field_ids(kind, table), path, fast=True)
    return path


def write_events(root: Path, rows: list[StoredEvent], ingested_at: datetime | None = None) -> list[Path]:
    """Durably write validated events, one file per (kind, run_id), commit them, and advance the chain
    heads (see runledger.ledger.storage.heads); return the files written."""
    ingested_at = ingested_at or datetime.now(timezone.utc)
    tables = tables_of(root)
    start_heads(root)
    written = {(kind, run_id): write_group(root, kind, run_id, group, ingested_at, tables)
               for (kind, run_id), group in group_events(rows).items()}
    by_kind: dict[str, list[Path]] = defaultdict(list)
    for (kind, _), path in written.items():
        by_kind[kind].append(path)
    tables.commit(by_kind)
    heads.record(root, [r.env for r in rows])
    return list(written.values())


def start_heads(root: Path) -> bool:
    """A root that records no chain heads yet starts recording them, from what is stored; True if it did
    (a root written before heads were recorded: truncation before this moment cannot be found)."""
    if heads.recorded(root):
        if heads.carry_up(root):  # (a bucket's root from before its heads were kept beside the tables)
            log.warning("root %s: its chain heads moved into the bucket beside its tables", root)
        return False
    found = stored_heads(root)
    heads.write(root, found, found)
    return bool(found)


@dataclass
class Quarantined:
    stream_seq: int
    subject: str
    reason: str
    raw: bytes
    event_id: str | None = None


def _utf8(text: str | None) -> str | None:
    """Text that UTF-8 can hold: a lone surrogate (which no UTF-8 input decodes to, but a str from
    Python may hold) is kept as its escape, so that refusing bad input can never fail to write."""
    return text if text is None or text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def write_quarantine(root: Path, items: list[Quarantined], received_at: datetime | None = None,
                     tables: "Tables | None" = None) -> Path | None:
    """Durably write refused input as one new file (with the field ids of `tables`, default the root's:
    `tables_of`), for a commit to follow."""
    if not items:
        return None
    tables = tables or tables_of(root)
    received_at = received_at or datetime.now(timezone.utc)
    table = pa.table({
        "stream_seq": [q.stream_seq for q in items],
        "subject": [_utf8(q.subject) for q in items],
        "reason": [_utf8(q.reason) for q in items],
        "raw": [q.raw for q in items],
        "received_at": pa.array([received_at] * len(items), TIMESTAMP),
        "event_id": [_utf8(q.event_id) for q in items],
    }, schema=QUARANTINE_SCHEMA)
    path = tables.base / "quarantine" / file_name("part", (q.stream_seq for q in items))
    write_atomic(tables.with_field_ids(QUARANTINE, table), path)
    return path
