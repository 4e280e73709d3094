"""Where the tables stand on the transparency log, kept in the Iceberg commit itself: every snapshot of
a ledger's commit records the index its events' first leaf takes in that ledger's log
(`runledger.leaves.{log}`: the log's size once every earlier commit has its leaves) and whose leaves
they are (`runledger.leaves-of` = `{log}`: on the commit's own snapshots only). Every later snapshot
of the table (compaction, removal, another partition's commit) carries `runledger.leaves.{log}` forward,
so each snapshot says the first leaf of the newest commit of that log at or before it.

So a restarting ledger whose log durably holds `size` leaves finds the events that may lack theirs (the
commits after the last signature, or a commit whose leaves a crash cut short) by walking each table's
snapshots back only while they say a first leaf at or past `size`, and reading only the files those
commits added: O(commits since the last signature), not O(events stored) (`since`).

A commit cut short between tables (some tables took their files, the rest did not) has its snapshots
found all the same: each carries the same first leaf. When the history needed is gone (an expired
snapshot, a file removed) or does not add up, `since` raises Unknown and the log is caught up from
every stored event instead (runledger.ledger.tlog.log: the slow path, always right).
"""

from __future__ import annotations

from pathlib import Path

from runledger.ledger.storage.paths import QUARANTINE

PREFIX = "runledger.leaves."  # + the log's name ("log", or a partition's "p{N}"): its commit's first leaf
OWNER_KEY = "runledger.leaves-of"  # the log whose leaves a snapshot's own files are (never carried)
KEY_COLUMNS = ["run_id", "producer", "attempt", "seq", "hash", "stream_seq"]

Key = tuple[str, str, int, int]


class Unknown(LookupError):
    """The tables' history cannot say which events lack their leaves (one line)."""


def commit_props(log_name: str, first_leaf: int) -> dict[str, str]:
    """The summary properties of a commit whose events take leaves first_leaf.. of log `log_name`."""
    return {PREFIX + log_name: str(first_leaf), OWNER_KEY: log_name}


def carried(summary: dict) -> dict[str, str]:
    """The first-leaf properties a later snapshot carries forward from its parent's `summary`."""
    return {k: v for k, v in summary.items() if k.startswith(PREFIX)}


def since(tables, log_name: str, size: int) -> list[tuple[Key, str]]:
    """((run_id, producer, attempt, seq), hash) of every event the commits of log `log_name` at or past
    leaf `size` added to `tables` (runledger.ledger.storage.tables.Tables), commit by commit in leaf order
    (within a commit, in stream order as the slow path has it). Raises Unknown if the history is gone
    or its commits do not follow each other leaf for leaf from `size`."""
    commits: dict[int, list[str]] = {}  # first leaf -> the files its commit added (across tables)
    for name in tables.names():
        if name != QUARANTINE:
            for first, files in _commits_of(tables.table(name), name, log_name, size):
                commits.setdefault(first, []).extend(files)
    out: list[tuple[Key, str]] = []
    for first in sorted(commits):
        if first != size + len(out):
            raise Unknown(f"the commit whose first leaf is {first} does not follow leaf {size + len(out)}")
        out += _keys(commits[first])
    return out


def _commits_of(t, name: str, log_name: str, size: int) -> list[tuple[int, list[str]]]:
    """(first leaf, files added) of each commit of `log_name` on table `t` at or past leaf `size`."""
    t.refresh()
    out = []
    snap = t.current_snapshot()
    while snap is not None:
        props = snap.summary.additional_properties
        first = props.get(PREFIX + log_name)
        if first is None or int(first) < size:  # (no commit of this log at or past `size` on this table)
            break
        if props.get(OWNER_KEY) == log_name:
            out.append((int(first), _added(t, snap)))
        if snap.parent_snapshot_id is None:
            break
        parent = t.metadata.snapshot_by_id(snap.parent_snapshot_id)
        if parent is None:
            raise Unknown(f"table {name}: snapshot {snap.parent_snapshot_id}, before a commit past leaf {size}, "
                          f"has expired")
        snap = parent
    return out


def _added(t, snap) -> list[str]:
    """The data files snapshot `snap` of table `t` added."""
    from pyiceberg.manifest import ManifestEntryStatus

    out = []
    for m in snap.manifests(t.io):
        if m.added_snapshot_id != snap.snapshot_id:
            continue
        for e in m.fetch_manifest_entry(t.io, discard_deleted=True):
            if e.status == ManifestEntryStatus.ADDED and e.snapshot_id == snap.snapshot_id:
                out.append(e.data_file.file_path)
    return out


def _keys(files: list[str]) -> list[tuple[Key, str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from runledger.ledger.storage.objects import as_path, source

    tables = []
    for f in files:
        p = as_path(f)
        try:
            tables.append(pq.read_table(source(p), columns=KEY_COLUMNS))
        except (FileNotFoundError, OSError) as err:  # (a file compaction or removal let go since)
            raise Unknown(f"{p if isinstance(p, Path) else f}: {err}") from None
    if not tables:
        return []
    t = pa.concat_tables(tables).sort_by([("stream_seq", "ascending"), ("run_id", "ascending"),
                                          ("producer", "ascending"), ("attempt", "ascending"), ("seq", "ascending")])
    cols = [t.column(n).to_pylist() for n in KEY_COLUMNS[:5]]
    return [((r, p, a, s), h) for r, p, a, s, h in zip(*cols)]
