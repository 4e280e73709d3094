"""The SQL console: a read-only query by `runledger sql`'s own path, bounded in rows and bytes."""

from __future__ import annotations

from pathlib import Path

from runledger import queries
from runledger.ui.snapshot import jsonable

MAX_SQL_ROWS = 10_000  # rows the SQL console fetches and shows (it says when there were more)
MAX_SQL_BYTES = 16 * 2**20  # ... and about bytes


def sql(root: Path, text: str, timeout_s: float = queries.TIMEOUT_S) -> dict:
    """A read-only query from the console: `runledger sql`'s own path (queries.query: its guard, its
    time and memory bounds, the views the query names over the current snapshot), at most
    MAX_SQL_ROWS rows and MAX_SQL_BYTES fetched ("truncated" says when there were more)."""
    cols, rows = queries.query(root, text, timeout_s, max_rows=MAX_SQL_ROWS, max_bytes=MAX_SQL_BYTES)
    return {"columns": cols, "rows": [[jsonable(v) if isinstance(v, (int, float, str, bool, type(None)))
                                       or hasattr(v, "isoformat") else str(v) for v in r] for r in rows],
            "total": len(rows), "truncated": rows.truncated,
            "note": f"truncated at {len(rows)} rows (the bound of {rows.why})" if rows.truncated else None}
