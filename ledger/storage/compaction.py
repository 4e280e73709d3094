"""Compaction: a partition's small files merged into one, in stream order, by a snapshot that swaps
them (the old files stay for readers until they expire: `runledger.ledger.storage.tables`); and the
repair that drops identical second copies of an event the same way."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from runledger.ledger.contract.metricnames import metric_column, metric_name, narrow_column
from runledger.ledger.storage.digest import digest_ok, with_digest
from runledger.ledger.storage import objects, paths
from runledger.ledger.storage.files import file_name, partition_dir, write_atomic
from runledger.ledger.storage.objects import source
from runledger.ledger.storage.paths import event_files
from runledger.ledger.storage.rows import ENVELOPE_SCHEMA, wide_fields
from runledger.ledger.storage.store import tables_of


COMPACT_MIN_FILES = 16  # a partition with this many small files is compacted
SMALL_FILE_BYTES = 16 << 20
TIER_BYTES = (1 << 20, SMALL_FILE_BYTES)


def _first_seq(f: Path) -> int:
    """The first stream seq in a file's name ({prefix}-{first}-{last}-{tag}.parquet); 0 if none."""
    parts = f.name.split("-")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else 0


def _partition_files(part: Path) -> list[Path]:
    """A partition's files as readers read them (its table's snapshot)."""
    return event_files(part.parent.parent.parent, part.parent.name.removeprefix("kind="), part.name.removeprefix("run_id="))


def _swap(part: Path, old: list[Path], table: pa.Table, name: str) -> Path:
    """Write `table` (the rows of the files `old`) as one file and put it in their place: a snapshot
    that swaps them (the old files stay for readers until they expire)."""
    bounds = pc.min_max(table.column("stream_seq")).as_py()
    table = with_digest(table)
    tables = tables_of(part.parent.parent.parent)
    kind = part.parent.name.removeprefix("kind=")
    out = partition_dir(tables.base, kind, part.name.removeprefix("run_id=")) / file_name(name, (bounds["min"], bounds["max"]))
    write_atomic(tables.with_field_ids(kind, table), out)
    tables.replace(kind, old, [out])
    return out


def kind_of(part: Path) -> str:
    """The kind of a partition folder ({root}/events/kind={kind}/run_id={run_id})."""
    return part.parent.name.removeprefix("kind=")


def escaped_names(kind: str, table: pa.Table) -> pa.Table:
    """`table` (rows of several files of one partition) with each StoredWide column of a root written
    before names were escaped (`metrics/Loss`) under its escaped name (`columns.metric_column`), merged
    into that column where a later file has it: one column per name, where `verify` looks for it. A row
    with a value in both (never written so) is left for `verify` to report: nothing is rewritten."""
    fields = set(wide_fields(kind))
    for column in list(table.column_names):
        field_name = column.split("/", 1)[0]
        if field_name not in fields or column == narrow_column(field_name):
            continue
        escaped = metric_column(field_name, metric_name(column))
        if escaped == column:
            continue
        values = table.column(column)
        if escaped in table.column_names:
            both = pc.and_(pc.is_valid(values), pc.is_valid(table.column(escaped)))
            if pc.any(both).as_py():
                raise ValueError(f"{kind}: a row holds a value in both {column!r} and {escaped!r}; not rewriting it")
            values = pc.coalesce(table.column(escaped), values)
            table = table.drop_columns([escaped])
        table = table.set_column(table.column_names.index(column), escaped, values)
    return table


def compact_partition(part: Path, min_files: int = COMPACT_MIN_FILES) -> Path | None:
    """Merge small files into one, in stream order; None if there is nothing to do.

    By tiers, so that a row is rewritten a few times, not once per compaction: the files under
    1 MiB once there are `min_files` of them, else the files under 16 MiB once there are as many.
    """
    sizes = {f: f.stat().st_size for f in _partition_files(part)}
    for upper in TIER_BYTES:
        small = sorted(f for f, size in sizes.items() if size < upper)
        if len(small) >= min_files:
            break
    else:
        return None
    small.sort(key=_first_seq)  # then the rows are mostly in stream order already
    read = [pq.read_table(source(f)) for f in small]
    changed = [f.name for f, t in zip(small, read) if not digest_ok(f, t)]
    if changed:  # compaction must not give changed rows a fresh digest: leave them for `verify` to report
        raise ValueError(f"not compacting {part}: {', '.join(changed[:3])} changed since the ledger wrote them")
    table = escaped_names(kind_of(part), pa.concat_tables(read, promote_options="default").replace_schema_metadata(None))
    seqs = table.column("stream_seq")
    if len(seqs) > 1 and not pc.all(pc.greater_equal(seqs[1:], seqs[:-1])).as_py():
        table = table.sort_by("stream_seq")
    return _swap(part, small, table, "compact")


_CONTENT = [n for n, _ in ENVELOPE_SCHEMA if n not in ("stream_seq", "ingested_at")]  # what the producer sent


def drop_identical_duplicates(part: Path) -> tuple[list[str], list[str]]:
    """Rewrite a partition without second copies of an event: rows whose event_id and whole content
    (every envelope column and the payload; not stream_seq or ingested_at) equal an earlier row's.
    The first copy by stream_seq is kept. Crash-safe like compaction: one new file, swapped in by one
    snapshot. Returns (event_ids removed once per extra copy,
    event_ids stored more than once with different content, which are left for a person to judge)."""
    files = sorted(_partition_files(part), key=_first_seq)
    if not files:
        return [], []
    read = [pq.read_table(source(f)) for f in files]
    changed = [f.name for f, t in zip(files, read) if not digest_ok(f, t)]
    if changed:  # a rewrite must not give changed rows a fresh digest
        raise ValueError(f"{part}: {', '.join(changed[:3])} changed since the ledger wrote them; not repairing it")
    table = pa.concat_tables(read, promote_options="default").sort_by("stream_seq")
    table = escaped_names(kind_of(part), table.replace_schema_metadata(None))
    content = table.select(_CONTENT).to_pylist()
    first: dict[str, dict] = {}
    keep, removed, differing = [], [], set()
    for i, row in enumerate(content):
        seen = first.setdefault(row["event_id"], row)
        if seen is row:
            keep.append(i)
        elif seen == row:
            removed.append(row["event_id"])
        else:
            differing.add(row["event_id"])
            keep.append(i)
    if removed:
        _swap(part, files, table.take(keep), "compact")
    return removed, sorted(differing)


def compact(root: Path, min_files: int = COMPACT_MIN_FILES) -> int:
    """Compact every partition that needs it; return how many partitions were compacted."""
    done = 0
    parts = sorted((Path(root) / "events").glob("kind=*/run_id=*"))
    if objects.warehouse_of(root):  # (the partitions are in the bucket: those of the snapshot, named as on disk)
        parts = sorted({Path(root) / "events" / f"kind={k}" / f"run_id={f.run_id}"
                        for k, listed in paths.cut(root).files.items() if k != paths.QUARANTINE for f in listed})
    for part in parts:
        if compact_partition(part, min_files) is not None:
            done += 1
    return done
