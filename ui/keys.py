"""A run's chart keys: the sources of a chart's points (`SOURCES`), and the numbers of each source a run has."""

from __future__ import annotations

import re

from runledger.ledger.contract.metricnames import metric_name
from runledger.queries.columns import envelope_columns, kind_columns
from runledger.ui.snapshot import Snapshot, quote

# the typed numbers a kind's events carry, charted like any metric (envelope columns excluded)
_NUMERIC = ("DOUBLE", "BIGINT")
# the sources of a chart's points: the view, the x it is drawn against, the smallest bucket width (a
# step is a whole number: a bucket narrower than one step holds at most one point, so the points are
# exact; a system sample is timed in seconds, to the microsecond)
SOURCE_KINDS = {"step": "step", "metrics": "metrics", "eval": "eval", "system": "system"}  # the kind each is stored as
SOURCES = {
    "step": ("step_events", "step", 1.0),
    "metrics": ("metric_events", "step", 1.0),
    "eval": ("eval_events", "step", 1.0),
    "system": ("system_events", "epoch(ts)", 1e-6),
}
_METRIC_COLUMN = re.compile(r"^metrics/.{1,200}$")
NARROW = "metrics/"  # the MAP column (name -> value) of the names past a table's bound on columns (narrow_column)


def keys(snapshot: Snapshot, run_id: str, cur=None) -> dict[str, list[str]]:
    """source -> the keys (columns) this run has at least one number in (read on `cur`, a cursor scoped
    to the run, or on one opened here)."""
    if cur is None:
        with snapshot.scoped([run_id]) as cur:
            return keys(snapshot, run_id, cur)
    out = {}
    for source, (view, x, _) in SOURCES.items():
        cols = numeric_columns(source, cur)
        if source in ("metrics", "system"):  # a name's column is in the run's files only if it logged it
            names = [key_name(source, c) for c in cols]
            names += [n for n in narrow_names(source, run_id, cur) if n not in set(names)]
            if names:
                out[source] = names
            continue
        if not cols:
            continue
        counts = ", ".join(f"count({quote(c)})" for c in cols)
        row = cur.execute(f"select {counts} from {view} where run_id = ?", [run_id]).fetchone()
        found = [key_name(source, c) for c, n in zip(cols, row) if n]
        if found:
            out[source] = found
    return out


def numeric_columns(source: str, cur) -> list[str]:
    view = SOURCES[source][0]
    if source in ("metrics", "system"):
        return [r[0] for r in cur.execute(f"describe {view}").fetchall() if _METRIC_COLUMN.match(r[0])]
    kind = {"step_events": "step", "eval_events": "eval"}[view]
    envelope = set(envelope_columns())
    return [c for c, t in kind_columns(kind) if t in _NUMERIC and c not in envelope]


def narrow_names(source: str, run_id: str, cur) -> list[str]:
    """The names of a metrics or system source the run logged past the table's bound on columns (in its MAP
    column: `runledger.ledger.contract.columns.WIDE_COLUMNS_PER_RUN`), charted like the others."""
    view = SOURCES[source][0]
    if NARROW not in {r[0] for r in cur.execute(f"describe {view}").fetchall()}:
        return []
    return [r[0] for r in cur.execute(f"select distinct unnest(map_keys({quote(NARROW)})) as k from {view} "
                                      f"where run_id = ? and {quote(NARROW)} is not null order by k", [run_id]).fetchall()]


def key_name(source: str, column: str) -> str:
    return metric_name(column) if source in ("metrics", "system") else column


def columns_of(source: str, keys: list[str], cur, run_id: str | None = None) -> list[str]:
    """The SQL of chart keys' values: each its stored column, quoted, or for a name past the table's bound on
    columns (`narrow_names` of `run_id`) its value in the MAP column. Refuses a key the run does not have
    (nothing else reaches the SQL)."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r} (one of {', '.join(SOURCES)})")
    known = {key_name(source, c): quote(c) for c in numeric_columns(source, cur)}  # (a name's column: escaped)
    if run_id is not None and source in ("metrics", "system") and any(key not in known for key in keys):
        for name in narrow_names(source, run_id, cur):
            known.setdefault(name, f"{quote(NARROW)}[{literal(name)}]")
    for key in keys:
        if key not in known:
            raise KeyError(f"no {source} key {key!r}")
    return [known[key] for key in keys]


def stored_columns(source: str, keys: list[str], cur) -> list[str] | None:
    """The stored columns of chart keys, unquoted, or None where a key has none (a name past the table's bound
    on columns, kept in the MAP column)."""
    stored = {key_name(source, c): c for c in numeric_columns(source, cur)}
    return [stored[k] for k in keys] if all(k in stored for k in keys) else None


def literal(text: str) -> str:
    """A string as an SQL literal."""
    return "'" + text.replace("'", "''") + "'"
