"""Reading a root a live ledger writes: a fresh snapshot per query (`reader`), polling a count."""

from __future__ import annotations

import time
from pathlib import Path

from runledger.ledger.storage.reads import read_events


class _Fetched:
    def __init__(self, rows: list[tuple]) -> None:
        self.rows = rows

    def fetchone(self) -> tuple | None:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[tuple]:
        return self.rows


class Reader:
    """`queries.connect(root)` anew for each query: the current snapshot of a root a live ledger writes."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def execute(self, sql: str, params: list | None = None) -> _Fetched:
        from runledger import queries

        con = queries.connect(self.root)
        return _Fetched((con.execute(sql, params) if params is not None else con.execute(sql)).fetchall())


def reader(root: Path) -> Reader:
    """A reader of the root once the runs finished on it are stored (as `runledger sql` waits for them:
    runledger.ledger.storing)."""
    from runledger.ledger.storing import wait_stored

    wait_stored(root)
    return Reader(root)


def wait_for_count(root: Path, sql: str, expected: int, timeout: float = 120) -> int:
    """Poll a count query over the ledger until it reaches `expected` (or time runs out)."""
    from runledger import queries

    deadline = time.monotonic() + timeout
    n = -1
    while time.monotonic() < deadline:
        n = queries.connect(root).execute(sql).fetchone()[0]
        if n >= expected:
            return n
        time.sleep(0.2)
    return n


def stored_ids(root) -> list[str]:
    return sorted(read_events(root, columns=["event_id"]).column("event_id").to_pylist())
