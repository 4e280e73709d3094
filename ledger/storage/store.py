"""The ledger's storage: append-only Parquet files of events and quarantined input, under one root.

Layout (DESIGN.md, Storage):
    {root}/events/kind={kind}/run_id={run_id}/part-{first}-{last}-{tag}.parquet
    {root}/quarantine/part-{first}-{last}-{tag}.parquet
where first/last are the NATS stream sequences the file holds. Every file is written atomically
(hidden temp file, fsync, rename, fsync dir) and never modified afterwards.

A root keeps these files as Apache Iceberg tables (`runledger.ledger.storage.tables`, one per kind and one of the
quarantine): a file is read once a commit puts it in the table's snapshot, and compaction commits a
snapshot that swaps small files for one, leaving the old ones to readers until they expire. A root
written before the tables (`paths.is_plain`) keeps the plain layout: a file is read once it is
renamed into place, and compaction writes one new file listing the files it replaces in its
metadata, then deletes them (`recover()` finishes one that a crash interrupted).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import secrets
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Collection, Iterable, get_args

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from runledger.ledger.storage import heads, paths
from runledger.ledger.contract.canonical import canonical_json
from runledger.ledger.contract.columns import payload_columns, wide_columns
from runledger.ledger.contract.events import KINDS
from runledger.ledger.contract.metricnames import metric_column, metric_name, narrow_column
from runledger.ledger.storage.paths import QUARANTINE, event_files, quarantine_files

if TYPE_CHECKING:
    from runledger.ledger.storage.tables import Tables

ARROW_TYPES = {"double": pa.float64(), "bigint": pa.int64(), "boolean": pa.bool_(), "varchar": pa.string(), "json": pa.string(),
               "map_double": pa.map_(pa.string(), pa.float64()), "map_varchar": pa.map_(pa.string(), pa.string())}
TIMESTAMP = pa.timestamp("us", tz="UTC")
ENVELOPE_SCHEMA = [
    ("event_id", pa.string()), ("run_id", pa.string()), ("producer", pa.string()), ("attempt", pa.int64()),
    ("seq", pa.int64()), ("kind", pa.string()), ("time", pa.string()), ("ts", TIMESTAMP),
    ("step", pa.int64()), ("schema_version", pa.int64()), ("prev_hash", pa.string()), ("hash", pa.string()),
    ("payload", pa.string()), ("stream_seq", pa.int64()), ("ingested_at", TIMESTAMP),
]
QUARANTINE_SCHEMA = pa.schema([
    ("stream_seq", pa.int64()), ("subject", pa.string()), ("reason", pa.string()), ("raw", pa.binary()),
    ("received_at", TIMESTAMP), ("event_id", pa.string()),
])
# Columns whose values are (nearly) all different: dictionary-encoding them only costs time.
UNIQUE_COLUMNS = frozenset({"event_id", "seq", "time", "ts", "step", "prev_hash", "hash", "payload", "stream_seq", "raw"})
REPLACES_KEY = b"runledger.replaces"
DIGEST_KEY = b"runledger.ledger_sha256"  # a file's digest of what the ledger put in its rows (see ledger_digest)
CONFLICT = "a conflicting event"  # the quarantine reason's mark for a second, different event under one event_id
COMPACT_MIN_FILES = 16  # a partition with this many small files is compacted
SMALL_FILE_BYTES = 16 << 20
TIER_BYTES = (1 << 20, SMALL_FILE_BYTES)


def _payload_defaults(kind: str) -> dict:
    out = {}
    for name, f in KINDS[kind].model_fields.items():
        out[name] = f.default_factory() if f.default_factory is not None else (None if f.is_required() else f.default)
    return out


_DEFAULTS = {kind: _payload_defaults(kind) for kind in KINDS}
_COLUMNS = {kind: payload_columns(kind) for kind in KINDS}


@functools.cache
def arrow_schema(kind: str) -> pa.Schema:
    """The Parquet schema of one kind: envelope columns, then one typed column per payload field."""
    fields = [pa.field(n, t) for n, t in ENVELOPE_SCHEMA]
    fields += [pa.field(n, ARROW_TYPES[c]) for n, c in _COLUMNS[kind].items() if c != "wide"]
    return pa.schema(fields)  # (a StoredWide field's columns follow, one per name: `columns.wide_columns`)


NARROW_TYPE = ARROW_TYPES["map_double"]  # a StoredWide field's names past the column bound (`columns.narrow_column`)


def wide_fields(kind: str) -> list[str]:
    """A kind's StoredWide fields (a column per name: `columns.wide_columns`)."""
    return [name for name, ck in _COLUMNS[kind].items() if ck == "wide"]


def typed_columns(kind: str, payloads: list[dict], stored: Collection[str] | None = None) -> dict[str, list]:
    """The typed payload columns for a list of (validated) payload dicts, defaults filled in (`stored`: the
    columns of the file they are in, which say where a StoredWide field's names are: `columns.wide_columns`)."""
    defaults = _DEFAULTS[kind]
    cols = {}
    for name, ck in _COLUMNS[kind].items():
        d = defaults[name]
        if ck == "wide":
            cols.update(wide_columns(name, payloads, stored))
        elif ck == "json":
            cols[name] = [None if (v := p.get(name, d)) is None else canonical_json(v) for p in payloads]
        else:
            cols[name] = [p.get(name, d) for p in payloads]
    return cols


@dataclass
class StoredEvent:
    """One validated event on its way to disk."""

    env: dict
    payload_text: str
    stream_seq: int


@dataclass
class Rows:
    """Validated events of one (kind, run_id) on their way to disk, as columns."""

    envs: list[dict] = field(default_factory=list)
    payload_texts: list[str] = field(default_factory=list)
    stream_seqs: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, events: list[StoredEvent]) -> "Rows":
        return cls([e.env for e in events], [e.payload_text for e in events], [e.stream_seq for e in events])


_ENVELOPE_STRUCT = pa.struct([(n, t) for n, t in ENVELOPE_SCHEMA if n not in ("ts", "payload", "stream_seq", "ingested_at")])
for _kind, _model in KINDS.items():  # events_table reads a null typed field as "absent": its default
    for _name, _f in _model.model_fields.items():
        assert _DEFAULTS[_kind][_name] is None or not (_COLUMNS[_kind][_name] != "json" and type(None) in get_args(_f.annotation)), \
            f"{_kind}.{_name}: a nullable field with a non-null default"
_TYPED_STRUCT = {  # a kind's payload fields that are not JSON text, converted by pyarrow in one pass
    kind: pa.struct([(n, ARROW_TYPES[c]) for n, c in cols.items() if c not in ("json", "wide")]) for kind, cols in _COLUMNS.items()
}


def typed_arrays(kind: str, payloads: list[dict], stored: Collection[str] | None = None) -> dict[str, pa.Array]:
    """The typed payload columns of (validated) payloads, as written: a field absent from a payload is
    its default; JSON fields are canonical text; a StoredWide field is a DOUBLE column per name, null
    where a payload has no such name, but for the names whose column `stored` (the columns the file
    holds) lacks, kept in its MAP column (`columns.wide_columns`). `runledger.ledger.check.rowcheck` compares stored
    columns with these."""
    out: dict[str, pa.Array] = {}
    struct = _TYPED_STRUCT[kind]
    defaults = _DEFAULTS[kind]
    if struct.num_fields:
        typed = pa.array(payloads, struct)  # pyarrow converts the dicts' fields itself (fast)
        for i, f in enumerate(struct):
            column = typed.field(i)  # a field absent from a payload is null: its default, if it has one
            if defaults[f.name] is not None and column.null_count:
                column = pc.fill_null(column, pa.scalar(defaults[f.name], f.type))
            out[f.name] = column
    for name, ck in _COLUMNS[kind].items():
        if ck == "json":
            d = defaults[name]
            out[name] = pa.array([None if (v := p.get(name, d)) is None else canonical_json(v) for p in payloads], pa.string())
        elif ck == "wide":
            narrow = narrow_column(name)
            out.update({column: pa.array(values, NARROW_TYPE if column == narrow else pa.float64())
                        for column, values in wide_columns(name, payloads, stored).items()})
    return out


def events_table(kind: str, rows: list[StoredEvent] | Rows, ingested_at: datetime,
                 stored: Collection[str] | None = None) -> pa.Table:
    """The file's table of these events (`stored`: the StoredWide columns it may hold, see typed_arrays;
    None: a column for every name)."""
    if not isinstance(rows, Rows):
        rows = Rows.of(rows)
    envs = rows.envs
    envelope = pa.array(envs, _ENVELOPE_STRUCT)  # pyarrow reads the dicts' fields itself (fast)
    data: dict[str, pa.Array] = {f.name: envelope.field(i) for i, f in enumerate(_ENVELOPE_STRUCT)}
    data["ts"] = data["time"].cast(pa.timestamp("ns", tz="UTC")).cast(TIMESTAMP, safe=False)
    data["payload"] = pa.array(rows.payload_texts, pa.string())
    data["stream_seq"] = pa.array(rows.stream_seqs, pa.int64())
    data["ingested_at"] = pa.repeat(pa.scalar(ingested_at, TIMESTAMP), len(envs))
    data.update(typed_arrays(kind, [e["payload"] for e in envs], stored))
    schema = arrow_schema(kind)
    known = set(schema.names)
    for column in [c for c in data if c not in known]:  # a StoredWide field's columns, in the order made
        schema = schema.append(pa.field(column, data[column].type))
    return pa.table([data[f.name] for f in schema], schema=schema)


def ledger_digest(table: pa.Table) -> str:
    """SHA-256 over what the ledger, not the producer, put in each row of an events file, in row order:
    event_id, stream_seq, ts and ingested_at. Written in the file's metadata (DIGEST_KEY) and checked by
    `verify`, so these columns cannot be changed unnoticed either (the producer's hash covers the rest)."""
    h = hashlib.sha256()
    h.update("\n".join(map(str, table.column("event_id").to_pylist())).encode())
    for name in ("stream_seq", "ts", "ingested_at"):
        col = pc.fill_null(table.column(name).cast(pa.int64()), -1)
        h.update(b"\0" + col.to_numpy().tobytes())
    return h.hexdigest()


def with_digest(table: pa.Table) -> pa.Table:
    return table.replace_schema_metadata({**(table.schema.metadata or {}), DIGEST_KEY: ledger_digest(table).encode()})


def digest_ok(path: Path, table: pa.Table | None = None) -> bool:
    """Whether a stored events file's ledger columns are as the ledger wrote them."""
    table = pq.read_table(path) if table is None else table
    recorded = (table.schema.metadata or {}).get(DIGEST_KEY)
    return recorded is not None and recorded.decode() == ledger_digest(table)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_dirs(path: Path) -> None:
    """mkdir -p, fsyncing each parent whose listing changed, so a new partition survives a crash."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(exist_ok=True)
        fsync_dir(d.parent)


def write_atomic(table: pa.Table, final: Path, metadata: dict[bytes, bytes] | None = None, fast: bool = False) -> int:
    """Write `table` to `final` so that it is either absent or complete and durable; return its size.
    `fast`: compress with snappy, not zstd (1.6x faster to write, 2x larger; for the ledger's fresh
    files, which compaction rewrites with zstd)."""
    _make_dirs(final.parent)
    tmp = final.parent / f".{final.name}.tmp"
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    try:
        with open(tmp, "wb") as f:
            pq.write_table(table, f, **({"compression": "snappy"} if fast else {"compression": "zstd", "compression_level": 1}),
                           use_dictionary=[n for n in table.column_names if n not in UNIQUE_COLUMNS])
            f.flush()
            os.fsync(f.fileno())
    except BaseException:  # e.g. the disk is full: leave nothing half-written behind
        tmp.unlink(missing_ok=True)
        raise
    os.rename(tmp, final)
    fsync_dir(final.parent)
    return final.stat().st_size


def _file_name(prefix: str, seqs: Iterable[int]) -> str:
    seqs = list(seqs)
    return f"{prefix}-{min(seqs):012d}-{max(seqs):012d}-{secrets.token_hex(4)}.parquet"


def partition_dir(root: Path, kind: str, run_id: str) -> Path:
    return Path(root) / "events" / f"kind={kind}" / f"run_id={run_id}"


def group_events(rows: list[StoredEvent]) -> dict[tuple[str, str], list[StoredEvent]]:
    """Events by (kind, run_id): one file each."""
    groups: dict[tuple[str, str], list[StoredEvent]] = defaultdict(list)
    for r in rows:
        groups[(r.env["kind"], r.env["run_id"])].append(r)
    return groups


_TABLES: dict[Path, "Tables"] = {}


def tables_of(root: Path) -> "Tables | None":
    """The writer's handle on a root's tables (made on first use), or None for a root in the plain
    layout (`paths.is_plain`): a new root gets tables."""
    root = Path(root).resolve()
    if root not in _TABLES:
        if paths.is_plain(root):
            return None
        from runledger.ledger.storage.tables import Tables

        _TABLES[root] = Tables(root)
    return _TABLES[root]


def forget_tables(root: Path) -> None:
    """Drop the cached handle (a test that rebuilds a root in place)."""
    _TABLES.pop(Path(root).resolve(), None)


def write_group(root: Path, kind: str, run_id: str, group: list[StoredEvent] | Rows, ingested_at: datetime,
                tables: "Tables | None" = None) -> Path:
    """Durably write one partition's events as one new file (with `tables`' field ids, for a commit to
    follow); return it."""
    rows = group if isinstance(group, Rows) else Rows.of(group)
    path = partition_dir(root, kind, run_id) / _file_name("part", rows.stream_seqs)
    stored = None
    if tables is not None and wide_fields(kind):  # which names get a column of their own: the table's bound
        wanted = {}
        for field_name in wide_fields(kind):
            for env in rows.envs:
                wanted.update(dict.fromkeys(metric_column(field_name, n) for n in env["payload"].get(field_name) or ()))
        stored = tables.wide_columns_for(kind, run_id, list(wanted))
        if len(stored) < len(wanted):
            stored |= {narrow_column(f) for f in wide_fields(kind)}
    table = with_digest(events_table(kind, rows, ingested_at, stored))
    write_atomic(table if tables is None else tables.with_field_ids(kind, table), path, fast=True)
    return path


def write_events(root: Path, rows: list[StoredEvent], ingested_at: datetime | None = None) -> list[Path]:
    """Durably write validated events, one file per (kind, run_id), commit them, and advance the chain
    heads (see runledger.ledger.storage.heads); return the files written."""
    ingested_at = ingested_at or datetime.now(timezone.utc)
    tables = tables_of(root)
    start_heads(root)
    written = {(kind, run_id): write_group(root, kind, run_id, group, ingested_at, tables)
               for (kind, run_id), group in group_events(rows).items()}
    if tables is not None:
        by_kind: dict[str, list[Path]] = defaultdict(list)
        for (kind, _), path in written.items():
            by_kind[kind].append(path)
        tables.commit(by_kind)
    heads.record(root, [r.env for r in rows])
    return list(written.values())


def stored_heads(root: Path) -> dict[str, dict[heads.Chain, heads.Head]]:
    """The heads of the chains as stored: per run, (producer, attempt) -> (highest seq, its hash)."""
    t = read_events(root, columns=["run_id", "producer", "attempt", "seq", "hash"])
    out: dict[str, dict[heads.Chain, heads.Head]] = {}
    if t.num_rows:
        heads.advance(out, t.to_pylist())
    return out


def start_heads(root: Path) -> bool:
    """A root that records no chain heads yet starts recording them, from what is stored; True if it did
    (a root written before heads were recorded: truncation before this moment cannot be found)."""
    if heads.recorded(root):
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
    """Durably write refused input as one new file (with `tables`' field ids, for a commit to follow)."""
    if not items:
        return None
    received_at = received_at or datetime.now(timezone.utc)
    table = pa.table({
        "stream_seq": [q.stream_seq for q in items],
        "subject": [_utf8(q.subject) for q in items],
        "reason": [_utf8(q.reason) for q in items],
        "raw": [q.raw for q in items],
        "received_at": pa.array([received_at] * len(items), TIMESTAMP),
        "event_id": [_utf8(q.event_id) for q in items],
    }, schema=QUARANTINE_SCHEMA)
    path = Path(root) / "quarantine" / _file_name("part", (q.stream_seq for q in items))
    write_atomic(table if tables is None else tables.with_field_ids(QUARANTINE, table), path)
    return path


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def stray_files(root: Path) -> list[Path]:
    """Parquet files under events/ or quarantine/ outside the layout's pattern: never the ledger's,
    read by no one (planted?). (A file in the pattern but in no snapshot of the tables is one the
    ledger wrote and never committed: read by no one either, see `paths.uncommitted_files`.)"""
    root = Path(root)
    layout = set(paths.matching(paths.event_glob(root))) | set(paths.matching(paths.quarantine_glob(root)))
    return sorted(f for d in ("events", "quarantine") for f in (root / d).rglob("*.parquet")
                  if f not in layout and "metadata" not in f.relative_to(root).parts)


def read_events(root: Path, kind: str | None = None, run_id: str | None = None,
                columns: list[str] | None = None) -> pa.Table:
    """Envelope columns (or `columns`) of every stored event, across kinds, unordered."""
    columns = columns or [n for n, _ in ENVELOPE_SCHEMA]
    for attempt in range(5):
        try:
            tables = [pq.read_table(f, columns=columns) for f in event_files(root, kind, run_id)]
            break
        except FileNotFoundError:  # compaction replaced a file between listing and reading: list again
            if attempt == 4:
                raise
    if not tables:
        return pa.schema([(n, t) for n, t in ENVELOPE_SCHEMA if n in columns]).empty_table().select(columns)
    return pa.concat_tables(tables)


# --------------------------------------------------------------------------------------------
# What is stored already (for idempotent ingest), recovery and compaction
# --------------------------------------------------------------------------------------------


@dataclass
class SeqIndex:
    """Which (run_id, producer, attempt, seq) are stored, compactly: seqs are gapless per chain,
    so each chain is `upto` (all seqs below it stored) plus the few stored above it."""

    chains: dict[tuple[str, str, int], list] = field(default_factory=dict)

    def __contains__(self, key: tuple[str, str, int, int]) -> bool:
        c = self.chains.get(key[:3])
        return c is not None and (key[3] < c[0] or key[3] in c[1])

    def any_stored(self, chain: tuple[str, str, int], first: int, count: int) -> bool:
        """Whether any of the seqs first .. first+count-1 of `chain` is stored."""
        c = self.chains.get(chain)
        return c is not None and (first < c[0] or any(first <= s < first + count for s in c[1]))

    def add_range(self, chain: tuple[str, str, int], first: int, count: int) -> None:
        """Add seqs first .. first+count-1 of `chain`."""
        c = self.chains.get(chain)
        if c is None and first == 0:
            self.chains[chain] = [count, set()]
        elif c is not None and c[0] == first and not c[1]:
            c[0] = first + count
        else:
            for seq in range(first, first + count):
                self.add((*chain, seq))

    def add(self, key: tuple[str, str, int, int]) -> None:
        c = self.chains.setdefault(key[:3], [0, set()])
        seq = key[3]
        if seq < c[0]:
            return
        c[1].add(seq)
        while c[0] in c[1]:
            c[1].discard(c[0])
            c[0] += 1

    def add_all(self, keys: list[tuple[str, str, int, int]]) -> None:
        """Add many; a run of consecutive seqs that continues a chain costs one step, not one per seq."""
        i, n = 0, len(keys)
        while i < n:
            chain, first = keys[i][:3], keys[i][3]
            j = i + 1
            while j < n and keys[j][3] == first + (j - i) and keys[j][:3] == chain:
                j += 1
            self.add_range(chain, first, j - i)
            i = j

    def __len__(self) -> int:
        return sum(c[0] + len(c[1]) for c in self.chains.values())

    @classmethod
    def load(cls, root: Path) -> "SeqIndex":
        idx = cls()
        t = read_events(root, columns=["run_id", "producer", "attempt", "seq"])
        if t.num_rows == 0:
            return idx
        # count_distinct, not count: a chain with a gap and a duplicate ([0, 1, 3, 3]) must not pass as gapless
        stats = t.group_by(["run_id", "producer", "attempt"]).aggregate(
            [("seq", "min"), ("seq", "max"), ("seq", "count_distinct")])
        irregular = set()
        for r in stats.to_pylist():
            key = (r["run_id"], r["producer"], r["attempt"])
            if r["seq_min"] == 0 and r["seq_count_distinct"] == r["seq_max"] + 1:
                idx.chains[key] = [r["seq_max"] + 1, set()]
            else:
                irregular.add(key)
        if irregular:  # gaps or duplicates on disk: index those chains seq by seq
            for r in t.to_pylist():
                key = (r["run_id"], r["producer"], r["attempt"])
                if key in irregular:
                    idx.add((*key, r["seq"]))
        return idx


def stored_quarantine_seqs(root: Path) -> set[int]:
    files = quarantine_files(root)
    if not files:
        return set()
    return set(pa.concat_tables([pq.read_table(f, columns=["stream_seq"]) for f in files]).column(0).to_pylist())


def stored_conflicts(root: Path, at: paths.Cut | None = None) -> dict[tuple[str, str, int], set[int]]:
    """(run_id, producer, attempt) -> the seqs at which a different event came under a stored event_id
    (in the cut `at`, else now)."""
    out: dict[tuple[str, str, int], set[int]] = {}
    for f in quarantine_files(root, at=at):
        t = pq.read_table(f, columns=["reason", "event_id"])
        for reason, eid in zip(t.column(0).to_pylist(), t.column(1).to_pylist()):
            parts = (eid or "").split(":")
            if CONFLICT in (reason or "") and len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
                out.setdefault((parts[0], parts[1], int(parts[2])), set()).add(int(parts[3]))
    return out


def taken_upto(root: Path) -> int:
    """The last stream seq the root's ledger has taken: what it stored, quarantined or recorded acking."""
    last = [read_position(root)]
    for files, column in ((event_files(root), "stream_seq"), (quarantine_files(root), "stream_seq")):
        for f in files:
            t = pq.read_table(f, columns=[column])
            if t.num_rows:
                last.append(pc.max(t.column(0)).as_py())
    return max(last)


def read_position(root: Path) -> int:
    try:
        return int((Path(root) / "ledger.position").read_text())
    except (OSError, ValueError):
        return 0


def write_position(root: Path, stream_seq: int) -> None:
    """Record that the ledger is about to ack messages up to `stream_seq` (all stored or quarantined),
    so that a consumer someone else moved past them is noticed at the next start. Not fsync'd: it
    survives a process kill; after a power loss, a stale value errs toward refusing to start."""
    tmp = Path(root) / ".ledger.position.tmp"
    tmp.write_text(str(stream_seq))
    os.replace(tmp, Path(root) / "ledger.position")


def root_id(root: Path) -> str:
    """This root's identity (random, made on first use): the ledger's consumer is tied to it."""
    path = Path(root) / "ledger.id"
    if not path.exists():
        tmp = path.with_name(f".ledger.id.{secrets.token_hex(4)}.tmp")
        tmp.write_text(secrets.token_hex(16))
        try:
            os.link(tmp, path)  # first writer wins; a racing one reads the winner's id
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        fsync_dir(Path(root))
    return path.read_text().strip()


def stored_hashes(root: Path, kind: str, run_id: str, event_ids: set[str]) -> dict[str, str]:
    """event_id -> stored hash for the given ids in one partition (used only when duplicates arrive)."""
    out = {}
    for f in event_files(root, kind, run_id):
        t = pq.read_table(f, columns=["event_id", "hash"])
        for eid, h in zip(t.column(0).to_pylist(), t.column(1).to_pylist()):
            if eid in event_ids:
                out[eid] = h
    return out


def recover(root: Path) -> dict[str, int]:
    """Make the root consistent after a crash (call holding the root's lock): drop temp files, and the
    files no commit took (tables), or finish interrupted compactions (plain layout)."""
    root = Path(root)
    removed_tmp = finished = 0
    for tmp in list(root.glob("events/*/*/.*.tmp")) + list(root.glob("quarantine/.*.tmp")):
        tmp.unlink(missing_ok=True)
        removed_tmp += 1
    tables = tables_of(root)
    if tables is not None:
        return {"temp_files_removed": removed_tmp, "uncommitted_files_removed": tables.remove_orphans()}
    for f in sorted(root.glob("events/*/*/compact-*.parquet")):
        if not f.exists():  # a later compaction replaced this compacted file, and it was removed just above
            continue
        meta = pq.read_schema(f).metadata or {}
        for name in json.loads(meta.get(REPLACES_KEY, b"[]")):
            src = f.parent / name
            if src.exists():
                src.unlink()
                finished += 1
        fsync_dir(f.parent)
    return {"temp_files_removed": removed_tmp, "compaction_sources_removed": finished}


def _first_seq(f: Path) -> int:
    """The first stream seq in a file's name ({prefix}-{first}-{last}-{tag}.parquet); 0 if none."""
    parts = f.name.split("-")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else 0


def _partition_files(part: Path) -> list[Path]:
    """A partition's files as readers read them (its table's snapshot), or every file (plain layout)."""
    if tables_of(part.parent.parent.parent) is None:
        return sorted(part.glob("*.parquet"))
    return event_files(part.parent.parent.parent, part.parent.name.removeprefix("kind="), part.name.removeprefix("run_id="))


def _swap(part: Path, old: list[Path], table: pa.Table, name: str) -> Path:
    """Write `table` (the rows of the files `old`) as one file and put it in their place: a snapshot
    that swaps them (tables; the old files stay for readers until they expire), or the new file listing
    the ones it replaces, which are then deleted (plain layout; `recover` finishes a crashed one)."""
    bounds = pc.min_max(table.column("stream_seq")).as_py()
    out = part / _file_name(name, (bounds["min"], bounds["max"]))
    table = with_digest(table)
    tables = tables_of(part.parent.parent.parent)
    if tables is not None:
        kind = part.parent.name.removeprefix("kind=")
        write_atomic(tables.with_field_ids(kind, table), out)
        tables.replace(kind, old, [out])
        return out
    write_atomic(table, out, {REPLACES_KEY: json.dumps([f.name for f in old]).encode()})
    for f in old:
        f.unlink()
    fsync_dir(part)
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
    read = [pq.read_table(f) for f in small]
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
    The first copy by stream_seq is kept. Crash-safe like compaction: one new file that lists the
    files it replaces, then they are deleted. Returns (event_ids removed once per extra copy,
    event_ids stored more than once with different content, which are left for a person to judge)."""
    files = sorted(_partition_files(part), key=_first_seq)
    if not files:
        return [], []
    read = [pq.read_table(f) for f in files]
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
    for part in sorted((Path(root) / "events").glob("kind=*/run_id=*")):
        if compact_partition(part, min_files) is not None:
            done += 1
    return done
