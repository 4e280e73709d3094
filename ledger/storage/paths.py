"""The files of a root that a reader reads (`runledger.ledger.storage.store` writes them; the SQL views, `verify`, replay
and the ledger itself read exactly these).

A root keeps its events as Apache Iceberg tables (`runledger.ledger.storage.tables`): one table per kind, partitioned
by run, plus one of quarantined input, in a SQL catalog (`{root}/catalog.db`). A reader reads the
files of one snapshot of each table: a file that compaction replaced stays until no reader that
started within the retention window can need it, and a file written but not committed is read by no
one. So no read meets a vanished file or counts a row twice.

Listing is lean on purpose: the catalog with sqlite3, the table metadata as JSON, the manifests with
fastavro (what pyiceberg's scan planning would read, without its 0.3-1 s import), so that `runledger
sql` still starts in the time DuckDB takes to load. A root whose tables are in a shared catalog
(`ledger serve --catalog URI`, a PostgreSQL say) names it in `{root}/catalog.uri`; its readers list
that catalog through SQLAlchemy (imported for such roots only).

What readers and writers refuse (`NotALedger`, one line): a root in the layout of before the tables
(event files, no `tables.json`: `refuse_old`), which this version no longer reads; a folder that is not
a ledger root (`check_root`: readers never answer a folder of something else with nothing); and
tables whose catalog is gone. The ledger never
writes delete files; a snapshot that holds one anyway (committed by hand) is one that Iceberg engines
read with rows removed: `cut` lists such files (`Cut.deletes`) and logs them, `verify` names them and
the SQL views refuse to read past them.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from runledger.ledger.storage import objects

MARKER = "tables.json"  # {"format": "iceberg", "root": the root's path when the tables were made}
CATALOG_FILE = "catalog.db"
HALTED_FILE = "ledger.halted"  # why the root's ledger stopped for good (runledger.ledger.ingest.service.StreamLost): no ledger serves it again
CATALOG_URI_FILE = "catalog.uri"  # a shared catalog's SQLAlchemy URI (written by runledger.ledger.ingest.partitions.use_catalog)
CATALOG_NAME = "runledger"
NAMESPACE = "runledger"
QUARANTINE = "quarantine"  # the quarantine's table (a kind is never called that: runledger.ledger.contract.events.KINDS)
COMMIT_KEY = "runledger.commit"  # a snapshot's ledger commit number (see Cut)
EXPIRED_KEY = "runledger.oldest-commit"  # a table property: the oldest ledger snapshot its expiry kept
GRAVEYARD = "runledger-graveyard.json"  # in a table's metadata/: files only expired snapshots held, kept for readers
DELETE_CONTENT = {1: "position", 2: "equality"}  # Iceberg's data_file.content of a delete file

log = logging.getLogger(__name__)


class SnapshotGone(LookupError):
    """The named ledger snapshot has expired, or never was."""


class NotALedger(ValueError):
    """A root readers refuse: not a ledger root, its catalog is gone, or its tables hold delete files;
    the message is the one-line reason."""


POSITION_FILE = "ledger.position"  # the single ledger's: the last stream seq it took (storage.positions)
# what runledger puts in a root before its tables are made (a ledger starting, producers spooling, a
# local server): a folder holding any of these, or nothing, is a ledger root with nothing stored yet
ROOT_ENTRIES = (MARKER, CATALOG_FILE, CATALOG_URI_FILE, "events", "quarantine", "ledger.lock", POSITION_FILE,
                "ledger.id", HALTED_FILE, "partitions", "heads", "tlog", "spool", "nats", "local",
                "files", "dashboard.json", "relays", "stream.adopted", "media", "tlog-state",  # (runs' folders, run.dir; the dashboard's address; push, adoption; blobs; the log's state)
                "warehouse.json", "s3.credentials")  # (a warehouse on object storage: objects)


def check_root(root: Path) -> None:
    """Raise NotALedger unless `root` is a ledger root a reader can read: tables with their catalog
    (`catalog.db`, or the shared one `catalog.uri` names), or a root being set up
    (not made yet, empty, or holding only what runledger makes before the tables: ROOT_ENTRIES; a
    reader polling a root while its ledger starts finds nothing stored yet, and the CLI refuses a
    folder that is not there). A new root that a ledger made (its tables, no event yet) passes; a file,
    or a folder of something else, does not."""
    root = Path(root)
    if not root.exists():
        return
    if not root.is_dir():
        raise NotALedger(f"{root} is not a ledger root: not a folder")
    if is_tables(root):
        _catalog_rows(root)  # (raises NotALedger if the catalog is gone or unreadable)
        return
    refuse_old(root)
    try:
        entries = {p.name for p in root.iterdir()}
    except OSError as err:
        raise NotALedger(f"{root} cannot be read: {err.strerror}") from None
    if entries and not entries & set(ROOT_ENTRIES):
        raise NotALedger(f"{root} is not a ledger root: it holds no {MARKER}, events/ or anything else of a ledger's")


def is_tables(root: Path) -> bool:
    """Whether `root` keeps its events as Iceberg tables (else nothing is stored yet, or it is old: `is_old`)."""
    return (Path(root) / MARKER).exists()


def is_old(root: Path) -> bool:
    """A root in the layout of before the tables: event or quarantine files, and no tables."""
    root = Path(root)
    return not is_tables(root) and (any(root.glob("events/kind=*/run_id=*/*.parquet"))
                                     or any((root / "quarantine").glob("*.parquet")))


def refuse_old(root: Path) -> None:
    """Raise NotALedger for a root in the layout of before the tables (`is_old`)."""
    if is_old(root):
        raise NotALedger(f"{root} is in the pre-Iceberg layout (Parquet files under events/, no {MARKER}), "
                         f"which this version of runledger no longer reads")


def event_glob(root: Path, kind: str | None = None, run_id: str | None = None) -> Path:
    """The pattern every stored event file matches (what is on disk: a snapshot's files, and those of none)."""
    return Path(root) / "events" / f"kind={kind or '*'}" / f"run_id={run_id or '*'}" / "*.parquet"


def quarantine_glob(root: Path) -> Path:
    return Path(root) / "quarantine" / "*.parquet"


def matching(pattern: Path) -> list[Path]:
    return sorted(Path(pattern.anchor).glob(str(pattern.relative_to(pattern.anchor))))


# --------------------------------------------------------------------------------------------
# A table's files in one snapshot, read without pyiceberg
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataFile:
    path: Path
    run_id: str | None  # its partition (None in the quarantine's table)
    rows: int | None = None  # the rows its manifest entry says it holds (record_count)


@dataclass(frozen=True)
class DeleteFile:
    """A delete file a snapshot holds: Iceberg engines drop the rows it names from what they read."""

    path: Path
    content: str  # "position" or "equality"
    manifest: Path


@dataclass
class Cut:
    """One snapshot of every table: what a reader reads. `commit` names it: the ledger numbers its
    commits, and a table's snapshot in cut N is its last one of a commit ≤ N (`runledger verify
    --snapshot N`, `replay --snapshot N`)."""

    commit: int
    snapshots: dict[str, int | None] = field(default_factory=dict)  # table -> its snapshot id (None: empty)
    files: dict[str, list[DataFile]] = field(default_factory=dict)  # table -> the snapshot's data files
    deletes: dict[str, list[DeleteFile]] = field(default_factory=dict)  # table -> its delete files (none, in a ledger's)
    field_ids: dict[str, dict[str, int]] = field(default_factory=dict)  # table -> its columns' ids in the snapshot's schema

    def refusal(self) -> str | None:
        """Why a reader of this cut would read otherwise than Iceberg engines do (delete files), or None."""
        found = [(t, d) for t, listed in sorted(self.deletes.items()) for d in listed]
        if not found:
            return None
        named = ", ".join(f"{d.path} ({d.content}, table {t})" for t, d in found[:3])
        return (f"the tables hold {len(found)} delete file(s), which the ledger never writes and Iceberg engines "
                f"apply: {named}{' ...' if len(found) > 3 else ''}; `runledger verify` names them")

    def event_files(self, kind: str | None = None, run_id: str | None = None) -> list[Path]:
        tables = [kind] if kind else [t for t in self.files if t != QUARANTINE]
        return sorted(f.path for t in tables for f in self.files.get(t, ())
                      if run_id is None or f.run_id == run_id)


# manifest path -> its live entries (content, path, run_id, record_count) (manifest files never change)
_MANIFESTS: dict[str, list[tuple[int, str, str | None, int | None, int | None]]] = {}


# what a reader needs of a manifest entry: decoding only these is faster than the whole entry
_ENTRY = {"type": "record", "name": "manifest_entry", "fields": [
    {"name": "status", "type": "int"},
    {"name": "data_file", "type": {"type": "record", "name": "r2", "fields": [
        {"name": "content", "type": "int", "default": 0},  # (v1 manifests have none: all data)
        {"name": "file_path", "type": "string"},
        {"name": "record_count", "type": ["null", "long"], "default": None},
        {"name": "file_size_in_bytes", "type": ["null", "long"], "default": None},
        {"name": "partition", "type": {"type": "record", "name": "r102", "fields": [
            {"name": "run_id", "type": ["null", "string"], "default": None}]}}]}}]}


_OBJECTS: dict[str, bytes] = {}  # an object's URI -> its bytes: metadata files, manifest lists and manifests never change


def _immutable(path) -> bytes:
    """The bytes of a table's metadata file, manifest list or manifest (each written once, never changed):
    an object's kept (the last 256), so a reader that lists the snapshot again GETs only what is new."""
    if not isinstance(path, objects.ObjectPath):
        return path.read_bytes()
    got = _OBJECTS.get(path.uri)
    if got is None:
        got = _OBJECTS[path.uri] = path.read_bytes()
        while len(_OBJECTS) > 256:
            _OBJECTS.pop(next(iter(_OBJECTS)))
    return got


def _avro(path: Path, projection: dict | None = None) -> list[dict]:
    import fastavro  # (only where there are tables)

    if isinstance(path, objects.ObjectPath):  # (read whole: fastavro seeks back on a schema it cannot resolve)
        import io

        opened = io.BytesIO(_immutable(path))
    else:
        opened = open(path, "rb")
    with opened as f:
        if projection is not None:
            try:
                return list(fastavro.reader(f, reader_schema=projection))
            except fastavro.read.SchemaResolutionError:  # another writer's names: read it whole
                f.seek(0)
        return list(fastavro.reader(f))


class _Rebase:
    """Paths recorded when the tables were made, read from where the root is now (a copied root)."""

    def __init__(self, root: Path) -> None:
        self.root = str(Path(root).resolve())
        try:
            self.recorded = json.loads((Path(root) / MARKER).read_text()).get("root", self.root)
        except (OSError, ValueError):
            self.recorded = self.root

    def __call__(self, location: str) -> Path:
        if location.startswith(objects.SCHEME):  # (a warehouse on object storage: objects)
            return objects.ObjectPath(location)
        location = location.removeprefix("file://")
        if self.recorded != self.root and (location == self.recorded or location.startswith(self.recorded + "/")):
            location = self.root + location[len(self.recorded):]
        return Path(location)


def _catalog_rows(root: Path) -> dict[str, str]:
    """table -> its current metadata file, from the root's sqlite catalog (or its shared catalog)."""
    shared = Path(root) / CATALOG_URI_FILE
    if shared.exists():
        return roots_catalog_rows(root, shared.read_text().strip())
    path = Path(root) / CATALOG_FILE
    if not path.exists():
        if not is_tables(root):
            return {}  # (no tables yet: a root not made)
        raise NotALedger(f"{root}: its tables' catalog {CATALOG_FILE} is missing (deleted?), so no snapshot can be read")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as err:
        raise NotALedger(f"{root}: its tables' catalog {CATALOG_FILE} cannot be opened ({err})") from None
    try:
        rows = con.execute("select table_name, metadata_location from iceberg_tables where catalog_name = ? and "
                           "table_namespace = ?", (CATALOG_NAME, NAMESPACE)).fetchall()
    except sqlite3.OperationalError as err:
        if "no such table" not in str(err):
            raise  # (a catalog that cannot be read, locked past the timeout say, is not one with no tables)
        if is_tables(root):  # (its catalog was made before the marker: emptied or replaced since)
            raise NotALedger(f"{root}: its tables' catalog {CATALOG_FILE} holds no tables (emptied?)") from None
        rows = []  # the catalog is being created
    except sqlite3.DatabaseError as err:  # not a database: overwritten
        raise NotALedger(f"{root}: its tables' catalog {CATALOG_FILE} cannot be read ({err})") from None
    finally:
        con.close()
    return dict(rows)


_ENGINES: dict = {}


def _shared_catalog_rows(uri: str) -> dict[str, str]:
    """_catalog_rows from a shared SQL catalog (any SQLAlchemy URI)."""
    import sqlalchemy

    engine = _ENGINES.get(uri)
    if engine is None:
        engine = _ENGINES[uri] = sqlalchemy.create_engine(uri, pool_pre_ping=True)
    try:
        with engine.connect() as con:
            rows = con.execute(sqlalchemy.text(
                "select table_name, metadata_location from iceberg_tables where catalog_name = :c and "
                "table_namespace = :n"), {"c": CATALOG_NAME, "n": NAMESPACE}).fetchall()
    except (sqlalchemy.exc.ProgrammingError, sqlalchemy.exc.OperationalError) as err:
        if "iceberg_tables" not in str(err):
            raise  # (only a catalog without its table yet is one with no tables)
        rows = []  # the catalog is being created
    return {name: location for name, location in rows}


def shown_uri(uri: str) -> str:
    """A catalog URI as it may be shown: its password, if any, as ***."""
    return re.sub(r"(://[^/@]*?:)[^@/]*@", r"\1***@", uri)


def roots_catalog_rows(root: Path, uri: str) -> dict[str, str]:
    """The rows of the shared catalog `uri` (see _catalog_rows), refused (NotALedger, one line) where
    the URI names no catalog this program opens, or the catalog holds another root's tables: read as
    this root's, they would show another ledger, or none."""
    import sqlalchemy

    try:
        rows = _shared_catalog_rows(uri)
    except (sqlalchemy.exc.ArgumentError, ImportError) as err:  # (an unknown scheme, a malformed URI, no driver)
        _ENGINES.pop(uri, None)
        raise NotALedger(f"{root}: catalog {shown_uri(uri)} cannot be opened: {str(err).splitlines()[0][:200]}") from None
    rebase = _Rebase(root)
    warehouse = (objects.warehouse_of(root) or {}).get("warehouse")
    for location in rows.values():
        path = str(rebase(location))
        if warehouse and path.startswith(warehouse + "/"):
            continue
        if not path.startswith(rebase.root + "/"):
            theirs = re.split(r"/(?:events|quarantine)/", path)[0]
            raise NotALedger(f"{root}: catalog {shown_uri(uri)} holds another root's tables ({theirs}), not this root's")
    return rows


def _snapshot_of(metadata: dict, commit: int | None) -> dict | None:
    """The table's snapshot in cut `commit` (None: its current one)."""
    snapshots = metadata.get("snapshots") or []
    if commit is None:
        current = metadata.get("current-snapshot-id")
        return next((s for s in snapshots if s["snapshot-id"] == current), None)
    best = None
    for s in snapshots:  # (in commit order)
        n = int(s.get("summary", {}).get(COMMIT_KEY, -1))
        if n <= commit and (best is None or n >= int(best["summary"][COMMIT_KEY])):
            best = s
    return best


def _files_of(snapshot: dict | None, rebase: _Rebase, deletes: list[DeleteFile] | None = None,
              listed: set[str] | None = None) -> list[DataFile]:
    """The data files of `snapshot`; its delete files (the ledger never writes any, but a hand may
    commit one) go to `deletes`, whether their manifest says it holds deletes or not. With `listed`,
    the manifests in it are skipped and those read added (snapshots share most of theirs)."""
    if snapshot is None:
        return []
    out = []
    for manifest in _avro(rebase(snapshot["manifest-list"])):
        path = manifest["manifest_path"]
        if listed is not None:
            if path in listed:
                continue
            listed.add(path)
        entries = _MANIFESTS.get(path)
        if entries is None:
            entries = []
            for e in _avro(rebase(path), _ENTRY):
                if e["status"] != 2:  # 2: deleted in this manifest's snapshot
                    d = e["data_file"]
                    content = d.get("content") or 0
                    if manifest.get("content", 0) != 0 and content == 0:
                        content = 1  # (an entry of a delete manifest is a delete file, whatever it says)
                    entries.append((content, d["file_path"], (d.get("partition") or {}).get("run_id"),
                                    d.get("record_count"), d.get("file_size_in_bytes")))
            _MANIFESTS[path] = entries
        for content, p, run, rows, size in entries:
            if content == 0:
                out.append(DataFile(rebase(p), run, rows))
                if size is not None and p.startswith(objects.SCHEME):  # (so DuckDB opens it with no HEAD first)
                    objects.remember_size(p, size)
            elif deletes is not None:
                deletes.append(DeleteFile(rebase(p), DELETE_CONTENT.get(content, f"content {content}"), rebase(path)))
    return out


def _field_ids(metadata: dict, snapshot: dict | None) -> dict[str, int]:
    """The top-level columns' field ids of the snapshot's schema (what Iceberg engines match a file's
    columns by, where DuckDB matches names)."""
    schema_id = (snapshot or {}).get("schema-id", metadata.get("current-schema-id"))
    schema = next((s for s in metadata.get("schemas") or [] if s.get("schema-id") == schema_id), None)
    return {f["name"]: f["id"] for f in (schema or {}).get("fields", [])}


def catalog_state(root: Path) -> tuple[tuple[str, str], ...]:
    """The tables' current metadata files, (table, location) sorted: the same while no table commits (a
    metadata file never changes once written), so a reader may keep what it listed of a snapshot by it."""
    return tuple(sorted(_catalog_rows(root).items()))


def cut(root: Path, commit: int | None = None) -> Cut:
    """The files of every table in ledger snapshot `commit` (None: the current snapshots). Raises
    SnapshotGone if a table has no snapshot that old left while it had one then."""
    root = Path(root)
    objects.configure(root)
    rebase = _Rebase(root)
    if commit is not None and commit < 1:
        raise SnapshotGone(f"ledger snapshot {commit}: snapshots are numbered from 1")
    out = Cut(commit or 0)
    for table, location in sorted(_catalog_rows(root).items()):
        metadata = json.loads(_immutable(rebase(location)))
        if commit is not None and commit < int(metadata.get("properties", {}).get(EXPIRED_KEY, 0)):
            raise SnapshotGone(f"ledger snapshot {commit} has expired: the oldest kept is "
                               f"{metadata['properties'][EXPIRED_KEY]}")
        snapshot = _snapshot_of(metadata, commit)
        out.snapshots[table] = None if snapshot is None else snapshot["snapshot-id"]
        deletes: list[DeleteFile] = []
        out.files[table] = _files_of(snapshot, rebase, deletes)
        if deletes:
            out.deletes[table] = deletes
        out.field_ids[table] = _field_ids(metadata, snapshot)
        if snapshot is not None and commit is None:
            out.commit = max(out.commit, int(snapshot.get("summary", {}).get(COMMIT_KEY, 0)))
    if out.deletes and (why := out.refusal()) != _LOGGED.get(str(root)):
        _LOGGED[str(root)] = why
        log.warning("%s: %s", root, why)
    return out


_LOGGED: dict[str, str] = {}  # root -> the delete files last logged for it (logged once, not per read)


# --------------------------------------------------------------------------------------------
# What readers call
# --------------------------------------------------------------------------------------------


def event_files(root: Path, kind: str | None = None, run_id: str | None = None, at: Cut | None = None) -> list[Path]:
    """The stored event files a reader reads (of `kind`, of `run_id`): the current snapshot's (or the cut
    `at`'s) that exist. One the snapshot names but that is gone (deleted by hand) is `missing_files`.
    A root with no tables yet has none; one in the old layout is refused (`refuse_old`)."""
    if at is None and not is_tables(root):
        refuse_old(root)
        return []
    at = at or cut(root)
    return [f for f in at.event_files(kind, run_id) if objects.exists(f)]


def quarantine_files(root: Path, at: Cut | None = None) -> list[Path]:
    if at is None and not is_tables(root):
        refuse_old(root)
        return []
    at = at or cut(root)
    return sorted(f.path for f in at.files.get(QUARANTINE, ()) if objects.exists(f.path))


def held_files(root: Path) -> set[Path]:
    """Every file some snapshot of some table holds, or that waits in a table's graveyard for the
    readers of an expired snapshot (see runledger.ledger.storage.tables)."""
    root = Path(root)
    objects.configure(root)
    rebase = _Rebase(root)
    out: set[Path] = set()
    for location in _catalog_rows(root).values():
        metadata = json.loads(_immutable(rebase(location)))
        listed: set[str] = set()  # (each manifest once: O(files), not O(files x snapshots kept))
        for snapshot in metadata.get("snapshots") or []:
            deletes: list[DeleteFile] = []
            out.update(f.path for f in _files_of(snapshot, rebase, deletes, listed))
            out.update(d.path for d in deletes)  # (kept: what other engines read, and evidence for verify)
        try:
            graveyard = json.loads((rebase(metadata["location"]) / "metadata" / GRAVEYARD).read_text())
        except (OSError, ValueError):
            graveyard = []
        out.update(rebase(p) for p, _ in graveyard)
    return out


def uncommitted_files(root: Path) -> list[Path]:
    """Files in the layout that no snapshot holds and no reader may still need: written by a ledger
    that died before committing them (or planted); read by no one, removed when a ledger next starts."""
    if not is_tables(root):
        return []
    held = held_files(root)
    warehouse = (objects.warehouse_of(root) or {}).get("warehouse")
    if warehouse:  # (the layout under the bucket's prefix)
        base = objects.ObjectPath(warehouse)
        listed = [f for f in (base / "events").files() if "/metadata/" not in f.uri] + (base / "quarantine").files()
        listed = [f for f in listed if "/metadata/" not in f.uri]
        return [f for f in listed if f not in held]
    return [f for f in matching(event_glob(root)) + matching(quarantine_glob(root)) if f not in held]


def missing_files(root: Path, at: Cut | None = None) -> list[Path]:
    """Files the snapshot holds that are not on disk: removed by hand (verify names them)."""
    if not is_tables(root):
        return []
    at = at or cut(root)
    return sorted(f.path for files in at.files.values() for f in files if not f.path.exists())
