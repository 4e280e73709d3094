"""Events as the ledger stores them: the Arrow schema of each kind's files (the envelope's columns,
then one typed column per payload field, from `runledger.ledger.contract`) and of the quarantine's,
and validated events made into such a table."""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Collection, get_args

import pyarrow as pa
import pyarrow.compute as pc

from runledger.ledger.contract.canonical import canonical_json
from runledger.ledger.contract.columns import payload_columns, wide_columns
from runledger.ledger.contract.events import KINDS
from runledger.ledger.contract.metricnames import narrow_column


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


def group_events(rows: list[StoredEvent]) -> dict[tuple[str, str], list[StoredEvent]]:
    """Events by (kind, run_id): one file each."""
    groups: dict[tuple[str, str], list[StoredEvent]] = defaultdict(list)
    for r in rows:
        groups[(r.env["kind"], r.env["run_id"])].append(r)
    return groups
