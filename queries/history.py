"""A run's points read back whole, and the runs with their config, tags and summary: what `runledger.Api`,
the dashboard's `/api/history` and `runledger mcp` read. Every point, no sampling.

`history(root, run, keys)` is one wide Arrow table (`step`, `attempt`, `time`, then a column per key):
each `metrics` event (`runledger.log`) of the run that holds one of the keys, a value logged as NaN or
±Infinity read back as that float (the ledger keeps it as null with `nonfinite` saying which). By default
each step from the latest attempt that logged it (the `metrics` view's rule); `attempt=N`, that attempt's
points only. `source="step"` reads the typed `step` events of runledger's own trainer instead.

Paged (`limit`, `after`): the rows in (step, producer, attempt, seq) order, at most `limit` of them (and at most
MAX_PAGE_CELLS values: a page of many keys has fewer rows), and the cursor of the last one, which the next page
starts after. A cursor names its run: one given for another
run is refused (`BadCursor`), never answered with that run's points. Pages are read with the SQL
bounds of `runledger.queries` (read-only connection, data folders only).
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runledger import queries
from runledger.ledger.contract.metricnames import metric_column, narrow_column

if TYPE_CHECKING:
    import pyarrow as pa

MAX_PAGE = 100_000  # rows of one page (/api/history, `runledger mcp`'s history): the hardening issue's bound on a read
DEFAULT_PAGE = 10_000
MAX_PAGE_CELLS = 2_000_000  # values of one page (rows x keys): a page of many keys has fewer rows, and the cursor goes on
MAX_KEYS = 256  # keys one history read asks for (a run logs at most columns.WIDE_COLUMNS_PER_RUN wide ones, and more narrow)
SOURCES = ("metrics", "step")
ORDER = ("step", "producer", "attempt", "seq")  # a row's place in a run's history: unique, and what a cursor holds
_STEP_FIELDS = re.compile(r"^[a-z_][a-z0-9_]*$")  # a typed step column's name


class BadCursor(ValueError):
    """A cursor that is not one of these, or one of another run or read."""


class UnknownKey(ValueError):
    """A key the run never logged."""


def _cursor(run_id: str, source: str, attempt: int | None, last: tuple) -> str:
    body = json.dumps({"run": run_id, "source": source, "attempt": attempt, "after": list(last)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")


def read_cursor(cursor: str, run_id: str, source: str, attempt: int | None) -> tuple:
    """The (step, producer, attempt, seq) a cursor continues after; BadCursor if it is not one, or was given
    for another run, source or attempt."""
    try:
        body = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        after = body["after"]
        step, producer, att, seq = after
        if not (isinstance(step, int) and isinstance(producer, str) and isinstance(att, int) and isinstance(seq, int)):
            raise TypeError
    except (ValueError, TypeError, KeyError, AttributeError):
        raise BadCursor("not a history cursor (pass back the `cursor` a page gave, as it was)") from None
    if body.get("run") != run_id:
        raise BadCursor(f"this cursor is of run {str(body.get('run'))[:80]!r}, not of {run_id!r}")
    if body.get("source") != source or body.get("attempt") != attempt:
        raise BadCursor("this cursor is of another read (source or attempt): start again without it")
    return step, producer, att, seq


def _connect(root: Path, text: str):
    return queries.connect(root, memory_limit=queries.MEMORY_LIMIT, uses=text)


# --------------------------------------------------------------------------------------------- runs


_RUNS = """
select r.run_id, any_value(n.name) as name, any_value(n.project) as project,
       arg_max(r."group", (r.attempt, r.ts)) as "group", arg_max(r.job_type, (r.attempt, r.ts)) as job_type,
       arg_max(r.notes, (r.attempt, r.ts)) as notes, arg_max(r.tags, (r.attempt, r.ts)) as tags,
       arg_max(r.state, (r.attempt, r.ts)) as state, count(distinct r.attempt) as attempts,
       min(r.ts) as started_at, any_value(r.config_final) as config,
       (select arg_max(f.summary, f.ts) from runs_finished f where f.run_id = r.run_id) as summary
from runs r join run_names n using (run_id)  -- (group, notes, tags and state: the latest attempt's)
group by r.run_id
order by started_at, r.run_id
"""


def _json_cell(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def runs(root: str | Path, filters: dict | None = None) -> list[dict]:
    """Every run that started: run_id, name, project, group, job_type, notes, tags, state, attempts,
    started_at, config (every config.update applied) and summary (its last run_finished's), in start order.
    `filters`: keep the runs whose field equals the value (`{"project": "p", "state": "finished"}`), whose
    tags hold it (`{"tags": "baseline"}`) or whose config key does (`{"config.lr": 0.001}`)."""
    root = Path(root)
    con = _connect(root, _RUNS)
    try:
        cur = con.execute(_RUNS)
        cols = [d[0] for d in cur.description]
        rows = [dict(zip(cols, r)) for r in cur.fetchall()]
    finally:
        con.close()
    out = []
    for row in rows:
        row["config"] = _json_cell(row["config"]) or {}
        row["summary"] = _json_cell(row["summary"]) or {}
        row["tags"] = list(_json_cell(row["tags"]) or [])
        if row["started_at"] is not None and hasattr(row["started_at"], "isoformat"):
            row["started_at"] = row["started_at"].isoformat()
        if matches(row, filters or {}):
            out.append(row)
    return out


def matches(run: dict, filters: dict) -> bool:
    """Whether `run` (a row of `runs`) passes every filter (see `runs`); a filter of an unknown field is a ValueError."""
    for field, want in filters.items():
        if not isinstance(field, str):
            raise ValueError(f"a filter's field is a name, not {field!r}")
        if field.startswith("config."):
            if run["config"].get(field[7:]) != want:
                return False
        elif field == "tags":
            wanted = [want] if isinstance(want, str) else list(want)
            if not set(wanted) <= set(run["tags"]):
                return False
        elif field in ("run_id", "name", "project", "group", "job_type", "state"):
            if run[field] != want:
                return False
        else:
            raise ValueError(f"cannot filter runs by {field[:80]!r}: by run_id, name, project, group, job_type, state, "
                             "tags or config.KEY")
    return True


# --------------------------------------------------------------------------------------------- history


def _columns(con, view: str) -> list[str]:
    return list(con.sql(f"select * from {view} limit 0").columns)


def _metric_exprs(con, run_id: str, keys: list[str] | None, base: str) -> list[tuple[str, str]]:
    """(key, SQL expression of its value) for each key: its DOUBLE column or the narrow MAP's entry, a value
    that was not finite as that float. keys None: every key the run logged."""
    stored = set(_columns(con, "metric_events"))
    narrow = narrow_column("metrics")
    if keys is None:
        wide = [c for c in sorted(stored) if c.startswith("metrics/") and c != narrow]
        present = []
        if wide:
            counts = con.execute(f"select {', '.join(f'count({queries.sql_ident(c)})' for c in wide)} "
                                 f"from metric_events where run_id = ?", [run_id]).fetchall()[0]
            present = [c for c, n in zip(wide, counts) if n]
        names = [con.execute("select metric_key(?)", [c[len("metrics/"):]]).fetchall()[0][0] for c in present]
        maps = [m for m in (narrow, "nonfinite") if m in stored]  # (names past the bound; values not finite)
        extra = [r[0] for r in con.execute(
            "select distinct k from (" + " union all ".join(
                f"select unnest(map_keys({queries.sql_ident(m)})) as k from metric_events where run_id = $run" for m in maps)
            + ") order by k", {"run": run_id}).fetchall()] if maps else []
        keys = list(dict.fromkeys([*names, *extra]))
    out = []
    for key in keys:
        col = metric_column("metrics", key)
        parts = []
        if col in stored:
            parts.append(queries.sql_ident(col))
        if narrow in stored:
            parts.append(f"{queries.sql_ident(narrow)}[{queries.sql_str(key)}]")
        nonfinite = f"nonfinite[{queries.sql_str(key)}]"
        value = f"coalesce({', '.join(parts)})" if parts else "null::double"
        out.append((key, f"coalesce({value}, case {nonfinite} when 'nan' then 'nan'::double when 'inf' then 'inf'::double "
                         f"when '-inf' then '-inf'::double end)"))
    return out


def history(root: str | Path, run_id: str, keys: Iterable[str] | None = None, *, attempt: int | None = None,
            steps: tuple[int | None, int | None] | range | None = None, source: str = "metrics",
            after: str | None = None, limit: int | None = None) -> tuple[pa.Table, str | None]:
    """The run's points of `keys` (None: every key it logged) as an Arrow table, and the cursor of the next
    page (None: this was the last). `steps`: (first, last) inclusive, either None for open, or a range;
    `limit`: rows of a page (None: all of them, one table); `after`: a cursor a page gave.
    Raises UnknownKey, BadCursor, ValueError for bad arguments; a run with no points gives an empty table."""
    root = Path(root)
    if source not in SOURCES:
        raise ValueError(f"unknown source {str(source)[:40]!r}: one of {', '.join(SOURCES)}")
    keys = None if keys is None else list(dict.fromkeys(keys))
    if keys is not None:
        if len(keys) > MAX_KEYS:
            raise ValueError(f"at most {MAX_KEYS} keys at a time")
        for k in keys:
            if not isinstance(k, str) or not k or len(k) > 300:
                raise ValueError(f"a key is a metric's name of 1 to 300 characters, not {str(k)[:40]!r}")
    if attempt is not None and (not isinstance(attempt, int) or attempt < 0):
        raise ValueError(f"attempt is a whole number >= 0, not {attempt!r}")
    if limit is not None and (not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE):
        raise ValueError(f"limit is a number of rows from 1 to {MAX_PAGE}")
    lo, hi = _step_range(steps)
    last = read_cursor(after, run_id, source, attempt) if after else None
    if source == "metrics":
        base = "metric_events_latest" if attempt is None else "metrics_wide"
        uses = f"{base} metric_events metric_key"
    else:
        base = "steps" if attempt is None else "steps_all"
        uses = base
    con = _connect(root, uses)
    try:
        if source == "metrics":
            exprs = _metric_exprs(con, run_id, keys, base)
        else:
            fields = [c for c in _columns(con, "step_events") if _STEP_FIELDS.match(c)
                      and c not in queries.columns.envelope_columns() and c not in ("stream_seq", "ingested_at", "ts")]
            wanted = fields if keys is None else keys
            for k in wanted:
                if k not in fields:
                    raise UnknownKey(f"a step event has no field {k[:80]!r} (its fields: {', '.join(fields)})")
            exprs = [(k, queries.sql_ident(k)) for k in wanted]
        if keys is not None and source == "metrics":
            _check_logged(con, run_id, exprs)
        if limit:
            limit = max(1, min(limit, MAX_PAGE_CELLS // max(1, len(exprs))))
        where = ["run_id = $run"]
        params: dict[str, Any] = {"run": run_id}
        if attempt is not None:
            where.append("attempt = $attempt")
            params["attempt"] = attempt
        if lo is not None:
            where.append("step >= $lo")
            params["lo"] = lo
        if hi is not None:
            where.append("step <= $hi")
            params["hi"] = hi
        if last is not None:
            where.append("(coalesce(step, -1) > $s or (coalesce(step, -1) = $s and (producer > $p or (producer = $p and "
                         "(attempt > $a or (attempt = $a and seq > $q))))))")
            params.update(s=last[0], p=last[1], a=last[2], q=last[3])
        if exprs:
            where.append("(" + " or ".join(f"({e}) is not null" for _, e in exprs) + ")")
        else:
            where.append("false")
        select = ", ".join(["coalesce(step, -1) as step", "producer", "attempt", "seq", "time",
                            *(f"{e} as {queries.sql_ident(k)}" for k, e in exprs)])
        sql = (f"select {select} from {base} where {' and '.join(where)} "
               f"order by coalesce(step, -1), producer, attempt, seq" + (f" limit {limit + 1}" if limit else ""))
        table = con.sql(sql, params=params).to_arrow_table()
    finally:
        con.close()
    cursor = None
    if limit and table.num_rows > limit:
        table = table.slice(0, limit)
        row = {c: table.column(c)[limit - 1].as_py() for c in ORDER}
        cursor = _cursor(run_id, source, attempt, tuple(row[c] for c in ORDER))
    return table.drop_columns(["producer", "seq"]), cursor


def _check_logged(con, run_id: str, exprs: list[tuple[str, str]]) -> None:
    """UnknownKey for a key with no point in the run (a typo answers with an error, not an empty column)."""
    if not exprs:
        return
    counts = con.execute(f"select {', '.join(f'count({e})' for _, e in exprs)} from metric_events where run_id = ?",
                         [run_id]).fetchall()[0]
    missing = [k for (k, _), n in zip(exprs, counts) if not n]
    if missing:
        raise UnknownKey(f"run {run_id!r} logged no {', '.join(map(repr, missing[:5]))[:300]}"
                         + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""))


def _step_range(steps) -> tuple[int | None, int | None]:
    if steps is None:
        return None, None
    if isinstance(steps, range):
        if steps.step != 1:
            raise ValueError("steps: a range with step 1")
        return steps.start, steps.stop - 1
    try:
        lo, hi = steps
    except (TypeError, ValueError):
        raise ValueError("steps is (first, last) or a range") from None
    for v in (lo, hi):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise ValueError(f"steps: whole numbers or None, not {v!r}")
    return lo, hi


NONFINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}  # as JSON text has them


def jsonable_column(column) -> list:
    """An Arrow column's values for JSON, a float that is not finite as "NaN", "Infinity" or "-Infinity" (JSON
    has no such numbers; `from_jsonable` reads them back)."""
    values = column.to_pylist()
    if any(isinstance(v, float) and not math.isfinite(v) for v in values):
        return ["NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
                if isinstance(v, float) and not math.isfinite(v) else v for v in values]
    return values


def from_jsonable(values: list) -> list:
    """`jsonable_column`'s values as they were (a float column's "NaN", "Infinity", "-Infinity" as those floats)."""
    if any(isinstance(v, float) for v in values) or all(v is None or isinstance(v, str) and v in NONFINITE for v in values):
        return [NONFINITE[v] if isinstance(v, str) and v in NONFINITE else v for v in values]
    return values
