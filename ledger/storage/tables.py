"""The ledger's tables, as written: one Apache Iceberg table per event kind, partitioned by run, and
one of quarantined input, in a SQL catalog (sqlite in the root by default; any SQLAlchemy URI, e.g. a
shared PostgreSQL, through `uri`). Readers list a snapshot's files with `runledger.ledger.storage.paths.cut`.

The ledger writes each file itself (`runledger.ledger.storage.store`: its name, its digest, its compression) with the
table's field ids, then commits files to the tables. A commit gets the next ledger commit number
(`paths.COMMIT_KEY` in each snapshot's summary), so one number names a cut across the tables.
Compaction commits a snapshot that swaps small files for one (an `overwrite` with
`runledger.compaction` in its summary: pyiceberg 0.12 cannot write Iceberg's `replace` operation);
the files it swapped out stay on disk for readers until `expire` finds no kept snapshot that holds
them. A file written but never committed (the ledger died first) is an orphan: no snapshot holds it,
no reader reads it, and `remove_orphans` deletes it when a ledger next starts.

pyiceberg (and SQLAlchemy, about a second to import) is imported only here, and only when a root is
written: readers never need it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pyarrow as pa

from runledger.ledger.storage import objects, paths
from runledger.ledger.storage.paths import (CATALOG_FILE, CATALOG_NAME, COMMIT_KEY, EXPIRED_KEY, MARKER, NAMESPACE, QUARANTINE)

log = logging.getLogger(__name__)

RETENTION_S = float(os.environ.get("RUNLEDGER_SNAPSHOT_RETENTION_S", 600))  # how long a reader may take
# Snapshots kept per table (those of the last commits: `--snapshot N` reaches back this far). pyiceberg
# copies a table's whole metadata several times per commit, so a commit's cost grows with the
# snapshots kept (measured: 0.12 ms per snapshot per copy, 16 copies a commit); the files readers
# need are kept RETENTION_S by the graveyard instead, whatever the snapshots.
KEEP_SNAPSHOTS = 16
COMPACTION_KEY = "runledger.compaction"
FIELD_ID = b"PARQUET:field_id"
PROPERTIES = {
    "write.metadata.metrics.default": "none",  # no column bounds in the manifests: a reader lists files 3x faster
    "write.metadata.metrics.column.run_id": "full",  # a file's partition comes from its run_id bounds
    "commit.manifest-merge.enabled": "true",  # so a reader opens a few manifests, not one per commit
    "commit.manifest.min-count-to-merge": "16",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "8",
    "format-version": "2",
}


def _made_partitioned(schema: pa.Schema):
    """(iceberg schema, partition spec) for a new table of `schema`: partitioned by identity(run_id) when it
    has that column. Both go into the commit that makes the table. A spec added by a second commit left a
    window in which another writer (another partition's) loaded the table unpartitioned and appended
    files whose manifest entries name no run (seen as `verify`'s "manifest puts it in run None")."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
    from pyiceberg.schema import assign_fresh_schema_ids
    from pyiceberg.transforms import IdentityTransform

    fresh = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(schema.remove_metadata()))
    if "run_id" not in schema.names:
        return fresh, UNPARTITIONED_PARTITION_SPEC
    run_id = fresh.find_field("run_id", case_sensitive=True).field_id
    return fresh, PartitionSpec(PartitionField(source_id=run_id, field_id=1000, transform=IdentityTransform(),
                                               name="run_id"))


def default_uri(root: Path) -> str:
    return f"sqlite:///{Path(root).resolve() / CATALOG_FILE}"


def reading_catalog(root: Path):
    """The root's catalog as another engine opens it (pyiceberg's SqlCatalog, for Polars' `scan_iceberg`,
    Daft's `read_iceberg`): the root's SQL catalog (sqlite in the root, or the shared one it names) with its
    warehouse's file IO, so that a table's files are read wherever they are (in a bucket, with the endpoint
    and credentials the root's readers use: `objects.iceberg_properties`)."""
    from pyiceberg.catalog.sql import SqlCatalog

    root = Path(root).resolve()
    named = objects.configure(root)
    shared = root / paths.CATALOG_URI_FILE
    uri = shared.read_text().strip() if shared.exists() else default_uri(root)
    where = {"warehouse": named["warehouse"], **objects.iceberg_properties()} if named else {"warehouse": f"file://{root}"}
    return SqlCatalog(CATALOG_NAME, uri=uri, **where)


class Tables:
    """The tables of one root, for its writer."""

    def __init__(self, root: str | Path, uri: str | None = None, mark: bool = True) -> None:
        from pyiceberg.catalog.sql import SqlCatalog
        from pyiceberg.exceptions import NamespaceAlreadyExistsError

        self.root = Path(root).resolve()
        named = objects.configure(self.root)  # (a warehouse on object storage: runledger.ledger.storage.objects)
        self.base = objects.ObjectPath(named["warehouse"]) if named else self.root
        marker = self.root / MARKER
        moved = None
        if marker.exists():
            recorded = json.loads(marker.read_text()).get("root")
            if recorded and recorded != str(self.root) and named is None:
                moved = paths.cut(self.root)  # what its readers read, from its new place
                log.warning("root %s was moved from %s: registering its tables anew here (the snapshots kept for "
                            "readers are not carried over)", self.root, recorded)
                drop_tables(self.root)
            elif uri is None:  # its catalog gone: never made anew, which would leave every stored file an orphan
                paths.check_root(self.root)
        else:
            paths.refuse_old(self.root)  # (the layout of before the tables: never taken over)
        self.root.mkdir(parents=True, exist_ok=True)
        self.catalog = SqlCatalog(CATALOG_NAME, uri=uri or default_uri(self.root),
                                  **({"warehouse": str(self.base), **objects.iceberg_properties()} if named
                                     else {"warehouse": f"file://{self.root}"}))
        try:
            self.catalog.create_namespace(NAMESPACE)
        except NamespaceAlreadyExistsError:
            pass
        self._tables: dict = {}
        self._added: dict[tuple[str, str], int] = {}  # (table, run) -> metric columns this process added for it
        self._manifests: dict[str, list] = {}  # manifest path -> its live data files (manifests never change)
        self.commit_no = self._last_commit()
        self.registered_anew = moved is not None  # (its snapshots' history, the log's place in it, is gone)
        if moved is not None:
            self._register(moved)
        if mark:
            self.mark()

    def _register(self, cut: "paths.Cut") -> None:
        """Commit the files of `cut` (read from this root) to new tables, as ledger commit `cut.commit`."""
        import pyarrow.parquet as pq

        self.commit_no = cut.commit - 1
        files = {name: sorted(f.path for f in listed if f.path.exists()) for name, listed in cut.files.items()}
        for name, listed in files.items():
            if listed:  # (the files' own field ids: a union, since metric columns differ from file to file)
                self.table(name, pa.unify_schemas([pq.read_schema(f) for f in listed]))
        self.commit(files)

    def mark(self) -> None:
        """Write `tables.json`: from now on readers read the root's tables (`paths.is_tables`)."""
        marker = self.root / MARKER
        if not marker.exists() or json.loads(marker.read_text()).get("root") != str(self.root):
            tmp = marker.with_name(f".{MARKER}.tmp")
            tmp.write_text(json.dumps({"format": "iceberg", "root": str(self.root)}))
            os.replace(tmp, marker)

    # ---- tables and their schemas

    def location(self, name: str) -> Path:
        return self.base / QUARANTINE if name == QUARANTINE else self.base / "events" / f"kind={name}"

    def names(self) -> list[str]:
        return sorted(ident[-1] for ident in self.catalog.list_tables(NAMESPACE))

    def table(self, name: str, schema: pa.Schema | None = None):
        """The table `name`; made with `schema` (partitioned by run_id if it has one) if it is not there."""
        from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError

        t = self._tables.get(name)
        if t is not None:
            return t
        ident = (NAMESPACE, name)
        try:
            t = self.catalog.load_table(ident)
        except NoSuchTableError:
            if schema is None:
                raise
            try:  # (schema and partition spec in the one commit that makes it: see _made_partitioned)
                fresh, spec = _made_partitioned(schema)
                t = self.catalog.create_table(ident, schema=fresh, location=str(self.location(name)),
                                              partition_spec=spec, properties=PROPERTIES)
            except TableAlreadyExistsError:  # made meanwhile by another writer
                t = self.catalog.load_table(ident)
        self._tables[name] = t
        return t

    def forget(self, name: str) -> None:
        """Drop the cached handle on table `name` (stale: another writer changed it); loaded again on next use."""
        self._tables.pop(name, None)

    def wide_columns_for(self, name: str, run_id: str, wanted: list[str]) -> set[str]:
        """Which of a file's StoredWide columns `wanted` (`metrics/NAME`, in first-seen order) it may hold:
        those the table has, and new ones while the table has fewer than WIDE_COLUMNS_MAX and the run has
        added fewer than WIDE_COLUMNS_PER_RUN (`runledger.ledger.contract.columns`); the file keeps the other names in its
        MAP column. So a table's schemas, and what every commit and query of it costs, stay bounded."""
        from runledger.ledger.contract.columns import WIDE_COLUMNS_MAX, WIDE_COLUMNS_PER_RUN

        from pyiceberg.exceptions import NoSuchTableError

        try:
            have = set(self.table(name).schema().column_names)
        except NoSuchTableError:  # (made with this file's columns)
            have = set()
        new = [c for c in wanted if c not in have]
        if not new:
            return set(wanted)
        present = sum(1 for c in have if "/" in c and not c.endswith("/"))
        added = self._added.get((name, run_id), 0)
        room = max(0, min(WIDE_COLUMNS_MAX - present, WIDE_COLUMNS_PER_RUN - added))
        self._added[(name, run_id)] = added + min(room, len(new))
        return {c for c in wanted if c in have} | set(new[:room])

    def with_field_ids(self, name: str, data: pa.Table) -> pa.Table:
        """`data` with the table's field ids on its columns (what Iceberg readers match columns by), the
        table made or widened first: a column it lacks (a new metric's `metrics/NAME`, the MAP column
        `metrics/` of the names past the bound: `wide_columns_for`, or a text field the contract gained) is added."""
        from pyiceberg.types import DoubleType, MapType, StringType

        t = self.table(name, data.schema)
        missing = [f for f in data.schema if f.name not in t.schema().column_names]
        if missing:
            with t.update_schema() as update:
                for f in missing:
                    if f.type == pa.map_(pa.string(), pa.float64()):
                        kind = MapType(key_id=1, key_type=StringType(), value_id=2, value_type=DoubleType(),
                                       value_required=False)  # (ids given anew by add_column)
                    elif f.type == pa.map_(pa.string(), pa.string()):  # (a MAP field a newer contract added: metrics' text)
                        kind = MapType(key_id=1, key_type=StringType(), value_id=2, value_type=StringType(),
                                       value_required=False)
                    elif f.type == pa.float64():
                        kind = DoubleType()
                    elif f.type == pa.string():  # a field the contract gained (run_started.name, say): older rows read null
                        kind = StringType()
                    else:
                        raise ValueError(f"table {name}: cannot add column {f.name!r} of type {f.type}")
                    update.add_column((f.name,), kind)  # (a tuple: a name may hold a dot)
        schema = t.schema()
        fields = [_with_id(f, schema.find_field(f.name, case_sensitive=True)) for f in data.schema]
        return data.cast(pa.schema(fields, metadata=data.schema.metadata))

    # ---- commits

    def _last_commit(self) -> int:
        last = 0
        for name in self.names():
            snap = self.table(name).current_snapshot()
            if snap is not None:
                last = max(last, int(snap.summary.additional_properties.get(COMMIT_KEY, 0)))
        return last

    def commit(self, files: dict[str, list[Path]], position: dict[str, str] | None = None,
               leaves: dict[str, str] | None = None) -> int:
        """Commit written files (table -> files), each table's in one snapshot; returns the commit number.
        Tables are committed one after the other: a crash between two leaves the later ones' files as
        orphans, and the ledger, which acks only after the whole commit, stores those events again.
        `position` (runledger.ledger.storage.streampos.commit_props: how far on the stream the commit
        goes) goes into the last table's snapshot only, so that it is recorded once all are in; `leaves`
        (runledger.ledger.storage.leaves.commit_props: the commit's first leaf in the transparency log)
        into every table's, so that a commit cut short between tables is found by its first leaf too."""
        from pyiceberg.io.pyarrow import parquet_file_to_data_file

        self.commit_no += 1
        names = [name for name, listed in files.items() if listed]
        for name in names:
            listed, props = files[name], position if name == names[-1] else None
            t = self.table(name)
            self._retrying(t, lambda tx: self._append(tx, t, listed, parquet_file_to_data_file, props, leaves))
            if len(t.metadata.snapshots) >= 2 * KEEP_SNAPSHOTS:  # (so a commit's cost stays flat)
                self._expire(t, KEEP_SNAPSHOTS)
        return self.commit_no

    def _append(self, tx, t, paths, to_data_file, position: dict[str, str] | None = None,
                leaves: dict[str, str] | None = None) -> None:
        props = {**_positions(tx, position), **(leaves or {}), COMMIT_KEY: str(self.commit_no)}
        with tx.update_snapshot(snapshot_properties=props).merge_append() as append:
            for p in paths:
                append.append_data_file(to_data_file(t.io, tx.table_metadata, str(p)))

    def _retrying(self, t, change, tries: int = 5) -> None:
        """Apply `change(transaction)` to table `t` and commit; on a conflict (another writer committed
        first), reload and apply again."""
        from pyiceberg.exceptions import CommitFailedException

        for attempt in range(tries):
            try:
                with t.transaction() as tx:
                    change(tx)
                return
            except CommitFailedException:
                if attempt == tries - 1:
                    raise
                t.refresh()
                time.sleep(0.05 * (attempt + 1))

    def replace(self, name: str, old: list[Path], new: list[Path], summary: dict[str, str] | None = None) -> None:
        """Commit a snapshot in which the files `new` hold the rows of `old` (compaction, or a repair that
        drops identical second copies), or, with a `summary` naming a tombstone, the rows of `old` it does
        not cover (`runledger.ledger.storage.removal`). `old` stays on disk for the readers that hold it (see expire)."""
        from pyiceberg.io.pyarrow import parquet_file_to_data_file
        from pyiceberg.table.snapshots import Operation
        from pyiceberg.table.update.snapshot import _OverwriteFiles

        t = self.table(name)
        gone = {str(p) for p in old}
        props = {COMMIT_KEY: str(self.commit_no), **(summary or {COMPACTION_KEY: "true"})}

        def swap(tx) -> None:
            current = tx.table_metadata.current_snapshot()
            props.update(_positions(tx))
            found = [e.data_file for m in current.manifests(t.io) for e in m.fetch_manifest_entry(t.io, discard_deleted=True)
                     if e.data_file.file_path in gone]
            if len(found) != len(gone):
                raise ValueError(f"table {name}: {len(gone) - len(found)} of the files to replace are not in its snapshot")
            with _OverwriteFiles(operation=Operation.OVERWRITE, transaction=tx, io=t.io, snapshot_properties=props) as ow:
                for f in found:
                    ow.delete_data_file(f)
                for p in new:
                    ow.append_data_file(parquet_file_to_data_file(t.io, tx.table_metadata, str(p)))

        self._retrying(t, swap)

    # ---- what the snapshots hold; expiry and orphans

    def live_files(self, t, snapshot) -> set[str]:
        """The paths of the data files `snapshot` of table `t` holds (as its manifests name them)."""
        out: set[str] = set()
        for m in snapshot.manifests(t.io):
            files = self._manifests.get(m.manifest_path)
            if files is None:
                files = [e.data_file.file_path for e in m.fetch_manifest_entry(t.io, discard_deleted=True)]
                self._manifests[m.manifest_path] = files
            out.update(files)
        return out

    def expire(self, keep: int | None = None) -> int:
        """Expire all but each table's `keep` newest snapshots (default KEEP_SNAPSHOTS); what only the
        expired ones held (data files, manifests, manifest lists) goes to the graveyard, deleted by
        `sweep` RETENTION_S later: a reader that listed a snapshot's files within that window still
        finds every one. Returns how many snapshots were expired."""
        keep = KEEP_SNAPSHOTS if keep is None else keep
        return sum(self._expire(self.table(name), keep) for name in self.names())

    def _expire(self, t, keep: int) -> int:
        t.refresh()
        snaps = sorted(t.metadata.snapshots, key=lambda s: s.sequence_number)
        old, kept = snaps[:-keep] if keep else snaps[:-1], snaps[-keep:] if keep else snaps[-1:]
        if not old:
            return 0
        keep_files = set().union(*(self.live_files(t, s) for s in kept))
        drop_files = set().union(*(self.live_files(t, s) for s in old)) - keep_files
        keep_manifests = {m.manifest_path for s in kept for m in s.manifests(t.io)}
        drop_manifests = {m.manifest_path for s in old for m in s.manifests(t.io)} - keep_manifests
        oldest = min(int(s.summary.additional_properties.get(COMMIT_KEY, 0)) for s in kept)

        def forget(tx, ids=[s.snapshot_id for s in old]) -> None:
            from pyiceberg.table.update.snapshot import ExpireSnapshots

            ExpireSnapshots(tx).by_ids(ids).commit()
            tx.set_properties(**{EXPIRED_KEY: str(oldest)})

        self._retrying(t, forget)
        due = time.time() + RETENTION_S
        _Graveyard(self.location(t.name()[-1])).add(
            [(p if objects.is_object(p) else p.removeprefix("file://"), due) for p in [*drop_files, *drop_manifests, *(s.manifest_list for s in old)]])
        for path in drop_manifests:
            self._manifests.pop(path, None)
        return len(old)

    def sweep(self, now: float | None = None) -> int:
        """Delete what expired snapshots alone held once RETENTION_S has passed; returns how many files."""
        now = time.time() if now is None else now
        return sum(_Graveyard(self.location(name)).sweep(now) for name in self.names())

    def remove_orphans(self) -> int:
        """Delete the orphans (only while holding the root's lock: no writer has files in hand)."""
        found = paths.uncommitted_files(self.root)
        for p in found:
            p.unlink(missing_ok=True)
        return len(found)


class _Graveyard:
    """A table's files that no kept snapshot holds, each with the time after which no reader can need
    it (`{location}/metadata/` paths.GRAVEYARD; rewritten whole, atomically; `paths.held_files` reads it)."""

    def __init__(self, location: Path) -> None:
        self.path = objects.as_path(location) / "metadata" / paths.GRAVEYARD

    def _read(self) -> list[list]:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return []

    def _write(self, entries: list) -> None:
        if isinstance(self.path, objects.ObjectPath):  # (one PUT: whole or not there)
            self.path.write_text(json.dumps(entries))
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(entries))
        os.replace(tmp, self.path)

    def add(self, entries: list[tuple[str, float]]) -> None:
        if entries:
            self._write(self._read() + [list(e) for e in entries])

    def sweep(self, now: float) -> int:
        entries = self._read()
        due = [p for p, t in entries if t <= now]
        for p in due:
            try:
                objects.as_path(p).unlink()
            except FileNotFoundError:
                pass
        if due:
            self._write([e for e in entries if e[1] > now])
        return len(due)


def drop_tables(root: Path) -> None:
    """Forget a root's catalog and table metadata (its data files stay): before registering them anew."""
    import shutil

    (root / CATALOG_FILE).unlink(missing_ok=True)
    for metadata in [*root.glob("events/kind=*/metadata"), root / QUARANTINE / "metadata"]:
        shutil.rmtree(metadata, ignore_errors=True)


def _positions(tx, position: dict[str, str] | None = None) -> dict[str, str]:
    """The stream positions the current snapshot of `tx` carries, updated by `position` (see streampos)."""
    from runledger.ledger.storage.streampos import carried

    current = tx.table_metadata.current_snapshot()
    return carried(current.summary.additional_properties if current is not None else None, position)


def _with_id(f: pa.Field, ice) -> pa.Field:
    """`f` with the Iceberg field ids of `ice` (a map's key and value too)."""
    meta = {**(f.metadata or {}), FIELD_ID: str(ice.field_id).encode()}
    if pa.types.is_map(f.type):
        kt, vt = ice.field_type.key_id, ice.field_type.value_id
        key = pa.field("key", f.type.key_type, nullable=False, metadata={FIELD_ID: str(kt).encode()})
        value = pa.field("value", f.type.item_type, metadata={FIELD_ID: str(vt).encode()})
        return pa.field(f.name, pa.map_(key, value), f.nullable, meta)
    return f.with_metadata(meta)
