"""The ledger root as the dashboard reads it: its positions, one long-lived read-only DuckDB connection with
the views of `runledger sql` (queries/views.sql), and cursors scoped to the runs a read is about.

Every read takes a cursor of its own on which the kind views (and `events`) are shadowed by temp views
over the files of the current ledger snapshot for just the runs it is about (`scoped`): each query
binds every file of the views it reads, and a ledger of thousands of runs has thousands of files per
kind, so a run's page reads its own files only. A read lists its snapshot when it starts, so it never
fails while the ledger writes or compacts (files a newer snapshot dropped are kept for readers a while:
runledger.ledger.storage.tables).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path

import duckdb

from runledger import queries
from runledger.ledger.storage import paths, stored
from runledger.queries.columns import envelope_columns, kind_columns, kind_views, kinds

HERE = Path(__file__).parent


def load(name: str) -> str:
    """The text of one of the dashboard's queries (the `.sql` files beside this one), e.g. load('runs')."""
    return (HERE / f"{name}.sql").read_text()


def quote(name: str) -> str:
    """A column name as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def jsonable(v):
    """One value as JSON can carry it (NaN as null, times as ISO 8601, decimals as floats)."""
    if isinstance(v, float) and v != v:  # NaN cannot be JSON
        return None
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if isinstance(v, Decimal):
        return float(v)
    return v


def rows_of(cur: duckdb.DuckDBPyConnection) -> list[dict]:
    cols = [d[0] for d in cur.description]
    return [{c: jsonable(v) for c, v in zip(cols, r)} for r in cur.fetchall()]


class Snapshot:
    """One ledger root's positions and its connection, read a snapshot at a time."""

    def __init__(self, root: str | Path, threads: int | None = None):
        self.root = Path(root).resolve()
        self._lock = threading.Lock()
        self._cursor_lock = threading.Lock()
        self.positions = stored.positions(self.root)  # the ledger's, or each partition's (see `position_of`)
        self.position = max(self.positions.values(), default=0)
        # the views of views.sql over no files: every read shadows the kind views with temp views over
        # the files of the runs it is about, listed from the current snapshot (`scoped`)
        self.con = queries.connect(self.root, threads=threads, memory_limit=queries.MEMORY_LIMIT, files={})
        self.threads = threads

    def close(self) -> None:
        self.con.close()

    def refresh(self, force: bool = False) -> bool:
        """Take the ledger's new positions, if one moved; True if one did. (Each read lists the files of
        the snapshot current when it starts, so nothing else is to be moved.)"""
        with self._lock:
            positions = stored.positions(self.root)
            if positions == self.positions and not force:
                return False
            self.positions, self.position = positions, max(positions.values(), default=0)
            return True

    def position_of(self, run_id: str) -> int:
        """How far the stream is stored for this run's events (its partition's position on a partitioned root)."""
        return stored.stored_upto(self.positions, run_id)

    @contextmanager
    def cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self._cursor_lock:  # (the connection takes one call at a time: a cursor is made under a lock)
            cur = self.con.cursor()
        try:
            yield cur
        finally:
            cur.close()

    def rows(self, sql: str, params: dict | list | None = None, scope: list[str] | None = None) -> list[dict]:
        """The rows of a query over the runs `scope` (None: every run)."""
        with self.scoped(scope) as cur:
            return rows_of(cur.execute(sql, params) if params is not None else cur.execute(sql))

    def run_files(self) -> dict[str, dict[str, list[Path]]]:
        """run_id -> kind -> its event files in the ledger's current snapshot (no file is opened). Kept while
        the catalog names the same metadata files (a table's metadata file never changes once written): every
        request of a page asks, and listing a big root's snapshot costs a few hundred ms. Not to be changed."""
        tables = paths.is_tables(self.root)
        key = paths.catalog_state(self.root) if tables else None
        kept = getattr(self, "_run_files", None)
        if key is not None and kept is not None and kept[0] == key:
            return kept[1]
        at = paths.cut(self.root) if tables else None
        out: dict[str, dict[str, list[Path]]] = {}
        for kind in kinds():
            for f in paths.event_files(self.root, kind, at=at):
                out.setdefault(f.parent.name.removeprefix("run_id="), {}).setdefault(kind, []).append(f)
        if key is not None:
            self._run_files = (key, out)
        return out

    @contextmanager
    def scoped(self, run_ids: list[str] | None, whole: tuple[str, ...] = ("forecast",),
               files: dict[str, dict[str, list[Path]]] | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor whose kind views (and `events`) read the current snapshot's files of `run_ids` only
        (None: every run's; the kinds in `whole`: every run's, a forecast being the ladder's event about
        its target): a run's page opens its own files, not the thousands of the other runs' (a query
        binds every file of the views it reads; `files`: run_files() when the caller has it already)."""
        files = files if files is not None else self.run_files()
        views = kind_views()
        with self.cursor() as cur:
            scans = {}
            for kind in kinds():
                chosen = [f for r in (files if kind in whole or run_ids is None else run_ids)
                          for f in files.get(r, {}).get(kind, [])]
                scans[kind] = queries.scan_files(chosen, kind_columns(kind))
                cur.execute(f"create or replace temp view {views[kind]} as select * from {scans[kind]}")
            cols = ", ".join(envelope_columns())
            cur.execute("create or replace temp view events as " +
                        " union all ".join(f"select {cols} from {scan}" for scan in scans.values()))
            yield cur
