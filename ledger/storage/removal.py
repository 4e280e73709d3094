"""A deleted run's rows taken out of the tables: what a tombstone (`runledger delete`, kind `tombstone`,
`runledger.ledger.contract.events.RunDeleted`) covers, and no more.

The ledger stores the tombstone like any event, under the run's id, then rewrites the run's
partitions without the rows the tombstone covers (each chain's events up to the seq it names): a
file all of whose rows go is dropped, one that keeps some is written again with those (a fresh digest:
its kept rows are the stored ones, read and checked first). One ordinary `overwrite` snapshot per
table, whose summary names the tombstone (TOMBSTONE_KEY), so no Iceberg delete file is ever left for
readers to apply, and every engine reads the run as gone. The tombstone's own table is never
rewritten: the tombstone stays, the record of what went, by whom and when. The files swapped out
stay on disk for the readers holding an older snapshot until they expire (`tables.expire`), as after
compaction. Removing is idempotent: a tombstone whose rows are gone already changes nothing, so the
ledger applies every stored tombstone again when it starts (one that died between storing a
tombstone and removing its rows finishes the removal).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from runledger.ledger.storage.digest import digest_ok, with_digest
from runledger.ledger.storage.files import file_name, write_atomic
from runledger.ledger.storage.objects import source
from runledger.ledger.storage.paths import event_files

log = logging.getLogger(__name__)

TOMBSTONE = "tombstone"  # the kind (and table) of tombstones
TOMBSTONE_KEY = "runledger.tombstone"  # in the summary of a snapshot that took a run's rows out: the tombstone's event_id


def covered(tombstone: dict) -> dict[tuple[str, int], tuple[int, str]]:
    """(producer, attempt) -> (seq, hash): what a tombstone's payload (a dict, or its canonical text) covers."""
    payload = json.loads(tombstone) if isinstance(tombstone, str) else tombstone
    return {(c["producer"], int(c["attempt"])): (int(c["seq"]), c["hash"]) for c in payload["chains"]}


def stored_tombstones(root: Path, run_id: str | None = None) -> list[dict]:
    """The stored tombstones (of `run_id`): envelope columns and `payload` (dict), in stream order."""
    files = event_files(Path(root), TOMBSTONE, run_id)
    if not files:
        return []
    cols = ["event_id", "run_id", "producer", "attempt", "seq", "time", "hash", "payload", "stream_seq"]
    rows = pa.concat_tables([pq.read_table(source(f), columns=cols) for f in files]).sort_by("stream_seq").to_pylist()
    for r in rows:
        r["payload"] = json.loads(r["payload"])
    return rows


def _covered_mask(table: pa.Table, chains: dict[tuple[str, int], tuple[int, str]]) -> pa.Array:
    """True for each row a tombstone covers: its (producer, attempt) is a chain it names, at or below that seq."""
    keep = pa.array([False] * table.num_rows)
    for (producer, attempt), (seq, _) in chains.items():
        mine = pc.and_(pc.and_(pc.equal(table.column("producer"), producer), pc.equal(table.column("attempt"), attempt)),
                       pc.less_equal(table.column("seq"), seq))
        keep = pc.or_(keep, mine)
    return keep


def remove_covered(root: Path, tombstone: dict, tables=None) -> int:
    """Take the rows `tombstone` (a stored tombstone: `stored_tombstones`) covers out of its run's
    partitions, every table's but the tombstones'; returns how many rows went (0: none were left).
    Raises ValueError, removing nothing of that partition, if a file changed since the ledger wrote it
    (a rewrite must not give changed rows a fresh digest: `verify` reports them)."""
    from runledger.ledger.storage.store import tables_of

    from runledger.ledger.contract.roles import is_person

    if not is_person(tombstone["producer"]):  # (quarantined on the way in; `verify` names any stored one)
        return 0
    root = Path(root)
    tables = tables or tables_of(root)
    run_id, chains = tombstone["run_id"], covered(tombstone["payload"])
    removed = 0
    for kind in tables.names():
        if kind == TOMBSTONE or kind == "quarantine":
            continue
        files = event_files(root, kind, run_id)
        if not files:
            continue
        old, new = [], []
        for f in files:
            t = pq.read_table(source(f))
            mask = _covered_mask(t, chains)
            gone = pc.sum(mask).as_py() or 0
            if not gone:
                continue
            if not digest_ok(f, t):
                raise ValueError(f"{f} changed since the ledger wrote it; not removing run {run_id}'s rows from it")
            old.append(f)
            removed += gone
            kept = t.filter(pc.invert(mask)).replace_schema_metadata(None)
            if kept.num_rows:
                bounds = pc.min_max(kept.column("stream_seq")).as_py()
                out = f.parent / file_name("kept", (bounds["min"], bounds["max"]))
                write_atomic(tables.with_field_ids(kind, with_digest(kept)), out)
                new.append(out)
        if old:
            tables.replace(kind, old, new, summary={TOMBSTONE_KEY: tombstone["event_id"]})
    if removed:
        log.info("run %s: removed %d rows covered by tombstone %s", run_id, removed, tombstone["event_id"])
    return removed


def remove_all_covered(root: Path, tables=None) -> int:
    """Apply every stored tombstone (see `remove_covered`); returns the rows removed."""
    return sum(remove_covered(root, t, tables) for t in stored_tombstones(root))


def tombstone_for(root: Path, run_id: str, by: str, authority: str, reason: str | None = None):
    """The tombstone (`RunDeleted`) of everything the ledger has stored of `run_id`: each chain up to the
    head it recorded (`runledger.ledger.storage.heads`; what is stored, for a root that records none), but the
    chains of earlier tombstones. Raises LookupError if nothing of the run is left to delete."""
    from runledger.ledger.contract.events import CoveredChain, RunDeleted
    from runledger.ledger.storage import heads
    from runledger.ledger.storage.reads import stored_heads

    root = Path(root)
    f = heads.run_file(root, run_id)
    recorded = heads.read_run(f) if f.exists() else stored_heads(root).get(run_id, {})
    tombs = {(t["producer"], t["attempt"]) for t in stored_tombstones(root, run_id)}
    gone = {}
    for t in stored_tombstones(root, run_id):
        gone.update(covered(t["payload"]))
    chains = [CoveredChain(producer=p, attempt=a, seq=seq, hash=h) for (p, a), (seq, h) in sorted(recorded.items())
              if (p, a) not in tombs and gone.get((p, a)) != (seq, h)]
    if not chains:
        raise LookupError(f"no events of run {run_id!r} are stored" + (" (deleted before)" if tombs else ""))
    return RunDeleted(chains=chains, events=sum(c.seq + 1 for c in chains), by=by, authority=authority, reason=reason)


def remaining(root: Path, tombstone: dict) -> int:
    """How many rows `tombstone` covers are still in the tables (0 once the ledger removed them)."""
    from runledger.ledger.contract.events import REGISTRY

    chains, n = covered(tombstone["payload"]), 0
    files = [f for kind in REGISTRY if kind != TOMBSTONE for f in event_files(Path(root), kind, tombstone["run_id"])]
    for f in files:
        n += pc.sum(_covered_mask(pq.read_table(source(f), columns=["producer", "attempt", "seq"]), chains)).as_py() or 0
    return n


def removed(root: Path, event_id: str) -> bool:
    """Whether the tombstone `event_id` is stored and none of the rows it covers is left."""
    run_id = event_id.split(":", 1)[0]
    mine = [t for t in stored_tombstones(Path(root), run_id) if t["event_id"] == event_id]
    return bool(mine) and remaining(root, mine[0]) == 0
