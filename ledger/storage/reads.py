"""Reading what a root stores: events' columns, chain heads as stored, the hashes of given events,
what the quarantine holds; and the Parquet files under the layout that no reader reads."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from runledger.ledger.storage import heads, paths
from runledger.ledger.storage.paths import event_files, quarantine_files
from runledger.ledger.storage.rows import ENVELOPE_SCHEMA
from runledger.ledger.storage.objects import source


CONFLICT = "a conflicting event"  # the quarantine reason's mark for a second, different event under one event_id


def read_events(root: Path, kind: str | None = None, run_id: str | None = None,
                columns: list[str] | None = None) -> pa.Table:
    """Envelope columns (or `columns`) of every stored event, across kinds, unordered."""
    columns = columns or [n for n, _ in ENVELOPE_SCHEMA]
    for attempt in range(5):
        try:
            tables = [pq.read_table(source(f), columns=columns) for f in event_files(root, kind, run_id)]
            break
        except FileNotFoundError:  # compaction replaced a file between listing and reading: list again
            if attempt == 4:
                raise
    if not tables:
        return pa.schema([(n, t) for n, t in ENVELOPE_SCHEMA if n in columns]).empty_table().select(columns)
    return pa.concat_tables(tables)


def stored_heads(root: Path) -> dict[str, dict[heads.Chain, heads.Head]]:
    """The heads of the chains as stored: per run, (producer, attempt) -> (highest seq, its hash)."""
    t = read_events(root, columns=["run_id", "producer", "attempt", "seq", "hash"])
    out: dict[str, dict[heads.Chain, heads.Head]] = {}
    if t.num_rows:
        heads.advance(out, t.to_pylist())
    return out


def stored_hashes(root: Path, kind: str, run_id: str, event_ids: set[str]) -> dict[str, str]:
    """event_id -> stored hash for the given ids in one partition (used only when duplicates arrive)."""
    out = {}
    for f in event_files(root, kind, run_id):
        t = pq.read_table(source(f), columns=["event_id", "hash"])
        for eid, h in zip(t.column(0).to_pylist(), t.column(1).to_pylist()):
            if eid in event_ids:
                out[eid] = h
    return out


def stored_quarantine_seqs(root: Path) -> set[int]:
    files = quarantine_files(root)
    if not files:
        return set()
    return set(pa.concat_tables([pq.read_table(source(f), columns=["stream_seq"]) for f in files]).column(0).to_pylist())


def stored_conflicts(root: Path, at: paths.Cut | None = None) -> dict[tuple[str, str, int], set[int]]:
    """(run_id, producer, attempt) -> the seqs at which a different event came under a stored event_id
    (in the cut `at`, else now)."""
    out: dict[tuple[str, str, int], set[int]] = {}
    for f in quarantine_files(root, at=at):
        t = pq.read_table(source(f), columns=["reason", "event_id"])
        for reason, eid in zip(t.column(0).to_pylist(), t.column(1).to_pylist()):
            parts = (eid or "").split(":")
            if CONFLICT in (reason or "") and len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
                out.setdefault((parts[0], parts[1], int(parts[2])), set()).add(int(parts[3]))
    return out


def stray_files(root: Path) -> list[Path]:
    """Parquet files under events/ or quarantine/ outside the layout's pattern: never the ledger's,
    read by no one (planted?). (A file in the pattern but in no snapshot of the tables is one the
    ledger wrote and never committed: read by no one either, see `paths.uncommitted_files`.)"""
    root = Path(root)
    layout = set(paths.matching(paths.event_glob(root))) | set(paths.matching(paths.quarantine_glob(root)))
    return sorted(f for d in ("events", "quarantine") for f in (root / d).rglob("*.parquet")
                  if f not in layout and "metadata" not in f.relative_to(root).parts)
