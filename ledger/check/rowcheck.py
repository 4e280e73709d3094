"""The checks of stored rows that need nothing but the row and its file: `check_part` checks a part of
one events file (some of its row groups) a batch at a time, in bounded memory, for `runledger.ledger.check.verify`.

Per row: the envelope's required cells are there; the row's kind and run are its partition's; the
event_id rule; the payload text is canonical JSON, valid for its kind; the hash recomputed from the
envelope columns and the payload text; `ts` is the event's `time`; the typed payload columns are what
the writer (`runledger.ledger.storage.rows.events_table`) makes of the payload. Per file: the ledger's digest of its
own columns (`runledger.ledger.storage.digest.ledger_digest`, recomputed a column at a time).

Two paths with one answer. The vectorised path (`batch_ok`) asks Arrow, orjson and one pydantic call
per batch whether every row of a batch passes; it only ever says yes or "not sure". For a batch it is
not sure of, the reference path (`row_problems`, one row at a time in plain Python) says which rows
fail and why, so the messages never depend on the path taken.

The vectorised path does no Python work per row but SHA-256 (a map over C functions, on the envelope
texts Arrow puts together in one buffer, compared as hex with the hash column's buffer). The payload
texts are parsed as one JSON list and written back by orjson in one call; the texts are canonical if
the list comes back byte for byte and each text is exactly one element of it (`_canonical_as_joined`).
"""

from __future__ import annotations

import binascii
import functools
import hashlib
import json
import operator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from runledger.ledger.check import chainwalk
from runledger.ledger.contract.columns import payload_columns
from runledger.ledger.storage.digest import DIGEST_KEY
from runledger.ledger.storage.rows import TIMESTAMP, typed_arrays, typed_columns
from runledger.ledger.contract.canonical import (canonical_json, event_hash, fast_canonical_texts, orjson_text_is_canonical)
from runledger.ledger.contract.events import InvalidEvent, make_event_id
from runledger.ledger.contract.validation import check_payload, payloads_valid
from runledger.ledger.storage import objects
from runledger.ledger.storage.objects import source

# Rows read and checked at once. Small batches on purpose: the memory of one is reused by the next (a
# batch of 65,536 rows, ~40 MB of Python objects, went back to the OS and was faulted in again each
# time: a third of the CPU time was the kernel's); Arrow's per-call costs are still small at this size.
BATCH_ROWS = 4_096
DIGEST_ROWS = 65_536  # values of one column hashed at once for the file's digest

LINK = chainwalk.LINK
REQUIRED = (*LINK, "kind", "time", "schema_version", "payload")


@dataclass
class PartChecked:
    """What `check_part` found in its part of a file."""

    path: str
    first_row_group: int
    rows: int = 0
    problems: list[str] = field(default_factory=list)
    file_sha256: str | None = None  # of the file's bytes, when asked (for `verify --since`)
    links: chainwalk.Summary | None = None  # its link columns summarised for the chain walk


def check_part(path: str, kind: str, run_id: str, row_groups: list[int], whole_file: bool,
               batch_rows: int = BATCH_ROWS, hash_bytes: bool = False,
               watch: dict[tuple[str, int], set[int]] | None = None) -> PartChecked:
    """Check the rows of `row_groups` of one events file; with `whole_file`, the file's digest too
    (and, with `hash_bytes`, the SHA-256 of its bytes). Never raises for a bad file: says so. The rows'
    links are summarised on the way (`chainwalk.Summariser`; `watch`: the seqs whose hashes are wanted),
    so that the chain walk need not read the part again."""
    out = PartChecked(path, row_groups[0] if row_groups else 0)
    links = chainwalk.Summariser(run_id, watch)
    out.links = links.summary
    where = f"{Path(path).relative_to(Path(path).parents[2])}"
    try:
        pf = pq.ParquetFile(source(path))
        if whole_file:
            if hash_bytes:
                out.file_sha256 = file_sha256(path)
            if not digest_ok(pf):
                out.problems.append(f"{path}: the ledger's columns (event_id, stream_seq, ts, ingested_at) do not "
                                    "match the digest it recorded for this file (changed after it was written?)")
        if not row_groups:
            return out
        for batch in pf.iter_batches(batch_size=batch_rows, row_groups=row_groups, use_threads=False):
            if not batch_ok(batch, kind, run_id):
                out.problems += row_problems(batch.to_pylist(), kind, run_id, where)
            links.take(batch)
            out.rows += batch.num_rows
    except (OSError, ValueError, KeyError, IndexError, TypeError, pa.ArrowException) as err:  # (ArrowInvalid is a
        # ValueError: not Parquet, truncated; the others: a file of a shape no writer of ours makes)
        out.problems.append(f"{path}: cannot be read ({type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''})")
    return out


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with (source(path) if objects.is_object(path) else open(path, "rb")) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def digest_ok(pf: pq.ParquetFile, batch_rows: int = DIGEST_ROWS) -> bool:
    """`runledger.ledger.storage.digest.digest_ok`, reading one column at a time in batches: the same bytes are hashed in
    the same order (every event_id, then each of stream_seq, ts, ingested_at)."""
    recorded = (pf.schema_arrow.metadata or {}).get(DIGEST_KEY)
    if recorded is None or not {"event_id", "stream_seq", "ts", "ingested_at"} <= set(pf.schema_arrow.names):
        return False
    h = hashlib.sha256()
    newline = b""  # "\n".join over the whole column: a newline before every batch but the first
    for batch in pf.iter_batches(batch_size=batch_rows, columns=["event_id"], use_threads=False):
        ids = batch.column(0)
        if not len(ids):
            continue
        if not pa.types.is_string(ids.type) or ids.null_count:  # (str(None) is "None": the reference way)
            h.update(newline + "\n".join(map(str, ids.to_pylist())).encode())
        else:  # each id and a newline, by Arrow, less the last newline
            h.update(newline)
            h.update(_buffers(pc.binary_join_element_wise(ids, "\n", ""))[0][:-1])
        newline = b"\n"
    for name in ("stream_seq", "ts", "ingested_at"):
        h.update(b"\0")
        for batch in pf.iter_batches(batch_size=batch_rows, columns=[name], use_threads=False):
            h.update(pc.fill_null(batch.column(0).cast(pa.int64()), -1).to_numpy().tobytes())
    return recorded.decode() == h.hexdigest()


# --------------------------------------------------------------------------------------------
# The vectorised path: "every row of this batch passes", or not sure
# --------------------------------------------------------------------------------------------


def batch_ok(batch: pa.RecordBatch, kind: str, run_id: str) -> bool:
    """True only if every row of `batch` passes every row check (see the module docstring)."""
    names = set(batch.schema.names)
    if not names.issuperset(REQUIRED) or any(batch.column(c).null_count for c in REQUIRED):
        return False
    col = batch.column
    if not (_all_equal(col("kind"), kind) and _all_equal(col("run_id"), run_id)):
        return False
    if not _hashes_ok(batch):
        return False
    if "ts" not in names or not _ts_ok(col("ts"), col("time")):
        return False
    payload_column = col("payload")
    if not pa.types.is_string(payload_column.type):
        return False
    joined, offsets = _json_array(payload_column)
    try:
        payloads = orjson.loads(joined)
    except orjson.JSONDecodeError:
        return False
    if len(payloads) != batch.num_rows or (payloads and set(map(type, payloads)) != {dict}):
        return False
    if not (_canonical_as_joined(payloads, joined, offsets) or _canonical_one_by_one(payloads, payload_column)):
        return False
    if not payloads_valid(kind, payloads):
        return False
    return _typed_columns_ok(batch, kind, payloads)


def _buffers(column: pa.Array) -> tuple[memoryview, np.ndarray]:
    """The bytes of a string column's values end to end, and each value's offset into them (n + 1)."""
    _, offsets, data = column.buffers()
    offsets = np.frombuffer(offsets, np.int32)[column.offset:column.offset + len(column) + 1]
    data = memoryview(b"") if data is None else memoryview(data).cast("B")
    return data[offsets[0]:offsets[-1]], offsets - offsets[0]


def _json_array(payloads: pa.Array) -> tuple[bytes, np.ndarray]:
    """`[t1,t2,...]` of the payload texts (one copy, by Arrow), and each text's offset into the texts
    end to end (n + 1 of them)."""
    _, offsets = _buffers(payloads)
    if len(payloads) == 0:
        return b"[]", offsets
    with_commas, _ = _buffers(pc.binary_join_element_wise(payloads, ",", ""))  # every text and a comma
    return b"[" + with_commas[:-1].tobytes() + b"]", offsets


_dumps_sorted = functools.partial(orjson.dumps, option=orjson.OPT_SORT_KEYS)


def _canonical_as_joined(payloads: list[dict], joined: bytes, offsets: np.ndarray) -> bool:
    """True only if every payload text is its payload's canonical text: orjson writes the whole list
    back as it was read, with text orjson is sure to write as RFC 8785 does (`orjson_text_is_canonical`),
    and the texts' boundaries are the list's, so that no text holds a piece of its neighbour: the only
    "},{" in the list are those between two texts, or else each text is as long as its payload's text."""
    try:
        out = _dumps_sorted(payloads)
    except (TypeError, orjson.JSONEncodeError):  # an int beyond 64 bits
        return False
    if out != joined or not orjson_text_is_canonical(out):
        return False
    n = len(payloads)
    commas = 1 + offsets[1:-1] + np.arange(n - 1)  # where each text but the last ends in the list (after "[")
    if joined.count(b"},{") == n - 1:
        view = np.frombuffer(joined, np.uint8)
        return bool((view[commas - 1] == ord("}")).all() and (view[commas + 1] == ord("{")).all())
    lengths = np.fromiter(map(len, map(_dumps_sorted, payloads)), np.int64, n)  # (dicts in lists: "},{" inside)
    return bool((lengths == np.diff(offsets)).all())


def _canonical_one_by_one(payloads: list[dict], texts: pa.Array) -> bool:
    """The payload texts against each payload's canonical text, made one at a time where need be."""
    canonical = fast_canonical_texts(payloads, numeric=False, parsed=True)
    if canonical is None:
        try:
            canonical = [canonical_json(p).encode() for p in payloads]
        except InvalidEvent:
            return False
    return canonical == texts.cast(pa.binary()).to_pylist()


def _all_equal(column: pa.Array, value: str) -> bool:
    return pa.types.is_string(column.type) and bool(pc.all(pc.equal(column, value)).as_py())


def _int_text(column: pa.Array) -> pa.Array:
    return column.cast(pa.string())


def _hashes_ok(batch: pa.RecordBatch) -> bool:
    """The event_id rule, and every hash recomputed from the envelope columns (`runledger.ledger.contract.canonical.envelope_text`
    put together by Arrow for a batch, when no string in it needs a JSON escape)."""
    col = batch.column
    ints = ("attempt", "seq", "schema_version", "step")
    strings = ("event_id", "prev_hash", "producer", "run_id", "time", "hash")
    if not all(pa.types.is_integer(col(c).type) for c in ints) or not all(pa.types.is_string(col(c).type) for c in strings):
        return False
    attempt, seq = _int_text(col("attempt")), _int_text(col("seq"))
    event_ids = pc.binary_join_element_wise(col("run_id"), col("producer"), attempt, seq, ":")
    if not pc.all(pc.equal(event_ids, col("event_id"))).as_py():
        return False
    if any(_may_need_escape(col(c)) for c in ("prev_hash", "producer", "run_id", "time")):
        return False
    step = pc.fill_null(_int_text(col("step")), "null")
    texts = pc.binary_join_element_wise(
        '{"attempt":', attempt, ',"event_id":"', col("event_id"), '","kind":"', col("kind"), '","payload":', col("payload"),
        ',"prev_hash":"', col("prev_hash"), '","producer":"', col("producer"), '","run_id":"', col("run_id"),
        '","schema_version":', _int_text(col("schema_version")), ',"seq":', seq, ',"step":', step,
        ',"time":"', col("time"), '"}', "")
    stored, offsets = _buffers(col("hash"))
    if not (np.diff(offsets) == HEX_DIGEST).all():  # (a hash of another length: the reference path names it)
        return False
    return stored == hex_sha256s(*_buffers(texts))


HEX_DIGEST = 64  # characters of a SHA-256 in hex


def hex_sha256s(data: memoryview, offsets: np.ndarray) -> bytes:
    """The lowercase hex SHA-256 of each value (data[offsets[i]:offsets[i + 1]]), end to end. The loop
    is map over C functions (no Python frame per value): hashing is most of its time."""
    bounds = offsets.tolist()
    digests = map(_DIGEST, map(hashlib.sha256, map(data.__getitem__, map(slice, bounds[:-1], bounds[1:]))))
    return binascii.hexlify(b"".join(digests))


_DIGEST = operator.methodcaller("digest")
_ESCAPED = np.zeros(256, bool)  # the bytes a JSON string escapes: '"', '\\' and the controls
_ESCAPED[:0x20] = _ESCAPED[ord('"')] = _ESCAPED[ord("\\")] = True


def _may_need_escape(column: pa.Array) -> bool:
    """Whether a value of a string column may hold a byte JSON escapes (any byte of its data does)."""
    data, _ = _buffers(column)
    return bool(_ESCAPED[np.frombuffer(data, np.uint8)].any())


def _ts_ok(ts: pa.Array, time: pa.Array) -> bool:
    """`ts` is null or the event's `time`, as the ledger derives it (see verify._ts_of)."""
    if ts.type != TIMESTAMP:
        return False
    try:
        expected = time.cast(pa.timestamp("ns", tz="UTC")).cast(TIMESTAMP, safe=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    same = pc.equal(ts, expected)
    return bool(pc.all(pc.or_kleene(same, pc.is_null(ts))).as_py())


def _typed_columns_ok(batch: pa.RecordBatch, kind: str, payloads: list[dict]) -> bool:
    """The typed payload columns are exactly what the ledger's writer makes of these payloads."""
    expected = typed_arrays(kind, payloads, batch.schema.names)
    columns = payload_columns(kind)
    for name, ck in columns.items():
        if ck == "wide":
            continue
        if name not in batch.schema.names:  # a field the contract gained after the file was written: none of
            if expected[name].null_count != batch.num_rows:  # its payloads may have it
                return False
        elif not batch.column(name).equals(expected[name]):
            return False
    # a StoredWide field's: a DOUBLE column per name (null where absent) and the MAP of the names past the bound
    for name in dict.fromkeys([*batch.schema.names, *expected]):
        if columns.get(name.split("/", 1)[0]) != "wide":
            continue
        want = expected[name] if name in expected else pa.nulls(batch.num_rows, batch.schema.field(name).type)
        if name not in batch.schema.names or not batch.column(name).equals(want):
            return False
    return True


# --------------------------------------------------------------------------------------------
# The reference path: one row at a time, saying what is wrong
# --------------------------------------------------------------------------------------------


def row_problems(rows: list[dict], kind: str, run_id: str, where: str) -> list[str]:
    """A line for each row that fails a check, naming the event and the file (`where`)."""
    columns = payload_columns(kind)
    typed = [c for c, ck in columns.items() if ck != "wide"]
    maps = {c for c in typed if columns[c].startswith("map_")}  # read back as [(name, value)]
    problems = []
    for row in rows:
        eid = row.get("event_id")
        try:
            missing = [c for c in REQUIRED if row.get(c) is None]
            if missing:  # a cell emptied or a column dropped: nothing else about the row can be trusted
                raise InvalidEvent(f"no value in {', '.join(missing)}")
            if row["kind"] != kind or row["run_id"] != run_id:
                raise InvalidEvent(f"row of kind {row['kind']!r}, run {row['run_id']!r} stored under kind={kind}/run_id={run_id}")
            if eid != make_event_id(row["run_id"], row["producer"], row["attempt"], row["seq"]):
                raise InvalidEvent("event_id does not match run_id:producer:attempt:seq")
            payload = json.loads(row["payload"])
            if canonical_json(payload) != row["payload"]:
                raise InvalidEvent("payload text is not canonical JSON")
            if event_hash(row, row["payload"]) != row["hash"]:
                raise InvalidEvent("hash does not match the stored content (changed after it was written?)")
            if row["ts"] is not None and row["ts"] != ts_of(row["time"]):
                raise InvalidEvent(f"ts {row['ts']} is not the event's time {row['time']}")
            check_payload(kind, payload)
            expected = typed_columns(kind, [payload], row)
            wide = [c for c in dict.fromkeys([*row, *expected]) if columns.get(c.split("/", 1)[0]) == "wide"]
            for col in typed:
                if col not in row and expected[col][0] is None:  # a field added after the file was written
                    continue
                if (dict(row[col]) if col in maps and row[col] is not None else row[col]) != expected[col][0]:
                    raise InvalidEvent(f"column {col} = {row[col]!r} but the payload says {expected[col][0]!r}")
            for col in wide:  # a DOUBLE column per name: null where the payload has no such name
                if col not in row or row[col] != (expected[col][0] if col in expected else None):
                    raise InvalidEvent(f"column {col} = {row.get(col, 'missing')!r} but the payload says "
                                       f"{expected[col][0] if col in expected else 'nothing'}")
        except (InvalidEvent, ValueError, TypeError, KeyError) as err:
            problems.append(f"{eid} ({where}): {err}")
    return problems


def ts_of(time_text: str):
    """The `ts` column the ledger derives from an event's (hashed) `time`."""
    return pa.array([time_text]).cast(pa.timestamp("ns", tz="UTC")).cast(TIMESTAMP, safe=False)[0].as_py()
