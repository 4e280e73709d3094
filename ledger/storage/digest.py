"""A file's digest of what the ledger, not the producer, put in its rows: written in each events
file's metadata, checked by `verify` and before a rewrite."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from runledger.ledger.storage.objects import source


DIGEST_KEY = b"runledger.ledger_sha256"  # a file's digest of what the ledger put in its rows (see ledger_digest)


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
    table = pq.read_table(source(path)) if table is None else table
    recorded = (table.schema.metadata or {}).get(DIGEST_KEY)
    return recorded is not None and recorded.decode() == ledger_digest(table)
