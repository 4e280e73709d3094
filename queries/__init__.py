"""SQL over the ledger: `connect(root)` gives a read-only DuckDB connection with the views of views.sql.

The views scan the Parquet files of one snapshot of the ledger's tables (`runledger.ledger.storage.paths.cut`): a
file compacted away meanwhile is still there for them, a file not yet committed is not read, and no
row is counted twice. `refresh(con, root)` moves a long-lived connection to the current snapshot.
The views' columns come
from `runledger.ledger.contract.events` (through `runledger.queries.columns`), so a kind with no files yet still has a view with
the right columns. Audits live as `.sql` files beside this one. Neither pydantic nor pyarrow is
imported on the way: a query starts in the time DuckDB takes to load.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from runledger.ledger.storage import objects, paths
from runledger.ledger.storage.paths import event_files, quarantine_files
from runledger.ledger.contract.roles import PERSON_PRODUCERS
from runledger.queries import thresholds
from runledger.queries.columns import Columns, envelope_columns, kind_columns, kinds, quarantine_columns

if TYPE_CHECKING:
    import duckdb

HERE = Path(__file__).parent
# what each statement of views.sql defines
_DEFINED = re.compile(r"^create or replace (?:view|macro) (\w+)", re.MULTILINE)
_STARTS = re.compile(r"^(?=create or replace (?:view|macro) )", re.MULTILINE)  # where a line starts one
_PLACEHOLDER = re.compile(r"\{\{(kind:)?([a-z_]+)\}\}")  # {{all_kinds}}, {{kind:metrics}}, ...
_WORD = re.compile(r"\w+")
_NAMED = re.compile(r"'(\w+)'")  # a string that is a name: a view a macro reads (`query_table('metrics_wide')`)
_STRING = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")  # a string, or a quoted column name ("metrics/loss")
_COMMENT = re.compile(r"--[^\n]*")


# Bounds of a query a person or a console runs (`runledger sql`, the UI): a mistake such as a cross
# join must end in an error, not hold the machine; both are options of `runledger sql`
TIMEOUT_S = 60.0
MEMORY_LIMIT = "2GB"
DATA_FOLDERS = ("events", "quarantine")  # what SQL may read under a root: never nats/ (the passwords)
# ... and in what comes back: rows and about bytes, made no further (a `select range from range(1e9)`
# is 1,000,000 rows, not a billion Python tuples); options of `runledger sql`, smaller in the UI
MAX_ROWS = 1_000_000
MAX_BYTES = 256 * 2**20
FETCH_CHUNK = 10_000  # rows fetched from DuckDB at a time


class ReadOnlyViolation(ValueError):
    """A statement other than a query was given to a read-only connection."""


class QueryTimeout(RuntimeError):
    """A query ran past its time limit and was interrupted."""


def sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def sql_ident(name: str) -> str:
    """A column name quoted for SQL (`group` is a keyword, `metrics/loss` holds a slash)."""
    return '"' + name.replace('"', '""') + '"'


def scan_files(files: list[Path], columns: Columns) -> str:
    """A scan of exactly these Parquet files, or an empty relation of the same columns; a column of the
    contract that the files lack (a field added after they were written) reads null."""
    cols = ", ".join(f"NULL::{duck_type} AS {sql_ident(name)}" for name, duck_type in columns)
    if not files:
        return f"(select {cols} where false)"
    listing = ", ".join(sql_str(str(f) if objects.is_object(f) else str(Path(f).resolve())) for f in files)
    return (f"(select * from read_parquet([{listing}], union_by_name=true, hive_partitioning=false) "
            f"union all by name select {cols} where false)")


def render_views(root: Path, files: dict[str, list[Path]] | None = None, at: paths.Cut | None = None) -> str:
    """views.sql with its placeholders replaced for the files under `root` (the tables' current
    snapshot, or the cut `at`), or, given `files` (kind -> Parquet files), for exactly those files (a
    scope: one run and what its audit needs)."""
    return "".join(view_statements(root, files, at))


def view_statements(root: Path, files: dict[str, list[Path]] | None = None, at: paths.Cut | None = None) -> list[str]:
    """render_views' text as its statements, one per view or macro in order (with the comments around it),
    cut where a line of views.sql starts a definition: before its placeholders are replaced (no path can
    cut one), and without DuckDB's parser, which takes longer over the whole file than a small query runs."""
    root = Path(root).resolve()
    statements = _STARTS.split((HERE / "views.sql").read_text())
    statements[1] = statements[0] + statements[1]  # (the file's opening comments)
    env_cols = ", ".join(envelope_columns())
    at = at or paths.cut(root)  # (given `files`: the quarantine and the runs of the current snapshot)
    if files is None:
        files = {k: event_files(root, k, at=at) for k in kinds()}
    kinds_sql = {k: scan_files(files.get(k, []), kind_columns(k)) for k in kinds()}
    runs = sorted({f.run_id for table, listed in at.files.items() for f in listed if f.run_id is not None})
    values = {"all_kinds": " union all ".join(f"select {env_cols} from {rel}" for rel in kinds_sql.values()),
              "audit_runs": f"select unnest([{', '.join(map(sql_str, runs))}]::varchar[]) as run_id",
              "threshold_defaults": thresholds.values_sql(),
              "threshold_profiles": thresholds.profiles_sql(),
              "person_producers": ", ".join(map(sql_str, PERSON_PRODUCERS)),
              "quarantine": scan_files(quarantine_files(root, at=at), quarantine_columns())}
    return [_PLACEHOLDER.sub(lambda m: kinds_sql[m.group(2)] if m.group(1) else values[m.group(2)], st)
            for st in statements[1:]]


COMPACTION_RACE_TRIES = 5


def open_connection(threads: int | None = None, read_only: bool = True) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with no views yet, for connect() to define them on (`threads`:
    DuckDB's worker threads, default all cores). A caller that reads a few rows before the views are
    defined (audit.scope_files) reads them on it, and so opens one DuckDB rather than two."""
    import duckdb  # (here, not at the top: `runledger.queries.names` and `.thresholds`, which `init` reads, need no DuckDB)

    config = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    if threads:
        config["threads"] = int(threads)
    con = duckdb.connect(":memory:", config=config)
    if read_only:
        con.execute("SET temp_directory = ''")
        # before the views: defining each one reads the footers of the files below it, once with the cache
        con.execute("SET parquet_metadata_cache = true")
    return con


def connect(root: str | Path, read_only: bool = True, threads: int | None = None,
            files: dict[str, list[Path]] | None = None,
            on_view: Callable[[duckdb.DuckDBPyConnection, str], None] | None = None,
            con: duckdb.DuckDBPyConnection | None = None,
            memory_limit: str | None = None, uses: str | None = None,
            snapshot: int | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the ledger's views over `root` (`threads`: DuckDB's
    worker threads, default all cores; `files`: views over just these files, see render_views;
    `on_view(con, name)`: called as soon as each view or macro of views.sql is defined; `con`: a
    connection from open_connection to define them on, else a new one; `memory_limit`: DuckDB's,
    e.g. "2GB", default DuckDB's own; `uses`: the text of the queries the connection is for, and
    then only the views and macros they can reach are defined, see `reachable`; `snapshot`: read
    ledger snapshot N, see `runledger.ledger.storage.paths.Cut`, not the current one).

    Raises paths.NotALedger (one line) for a root readers refuse: not a ledger root, a catalog gone,
    delete files in the tables (see runledger.ledger.storage.paths).

    With read_only (the default) the connection cannot write: external access is off except
    reading the data folders under `root` (DATA_FOLDERS), spilling to disk is off, extensions are
    not installed, and the configuration is locked. Use `query()` to also refuse any statement
    that is not a query, and to bound its time.
    """
    import duckdb

    root = Path(root).resolve()
    paths.check_root(root)  # (a folder that is not a ledger is refused, not answered with nothing)
    warehouse = (objects.configure(root) or {}).get("warehouse")  # (tables on object storage: read through pyarrow's S3)
    given = con
    for attempt in range(COMPACTION_RACE_TRIES):
        if snapshot is not None and not paths.is_tables(root):
            raise ValueError(f"{root} keeps no snapshots: nothing is stored there yet")
        at = paths.cut(root, snapshot) if snapshot is not None or files is None else None
        if at is not None and (why := at.refusal()):
            raise paths.NotALedger(f"{root}: {why}")
        con = given if given is not None else open_connection(threads, read_only)
        if warehouse:
            objects.register_duckdb(con)
        sql = render_views(root, files, at) if uses is None else "".join(reachable(view_statements(root, files, at), uses))
        try:
            if on_view is None:
                con.execute(sql)
            else:
                for statement in con.extract_statements(sql):
                    con.execute(statement.query)
                    on_view(con, _DEFINED.search(statement.query).group(1))
            break
        except duckdb.IOException as err:
            # the ledger compacted a partition between listing its files and binding a view to them:
            # list again, on a new connection (a caller's own connection cannot be started over)
            gone = "No such file" in str(err) or "No files found" in str(err)
            if given is not None or attempt == COMPACTION_RACE_TRIES - 1 or not gone:
                raise
            con.close()
            time.sleep(0.05 * (attempt + 1))
    if memory_limit:
        try:
            con.execute(f"SET memory_limit = {sql_str(memory_limit)}")
        except duckdb.Error as err:
            raise ValueError(f"memory limit {memory_limit!r} is not a size like 2GB or 500MB") from err
    if read_only:
        folders = ", ".join([sql_str(f"{root / name}/") for name in DATA_FOLDERS]
                            + [sql_str(f"{warehouse}/{name}/") for name in DATA_FOLDERS if warehouse])
        con.execute(f"SET allowed_directories = [{folders}]")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    return con


def refresh(con: duckdb.DuckDBPyConnection, root: str | Path) -> None:
    """Move a connection from connect(root) to the tables' current snapshot: its views are defined
    again over that snapshot's files (a query running meanwhile finishes on the old ones)."""
    con.execute(render_views(Path(root).resolve()))


def reachable(statements: list[str], uses: str) -> list[str]:
    """The statements of views.sql that the text `uses` can reach, in their order: those defining a
    view or macro it names, then those that these name, and so on. Every word of `uses` counts as a
    name (in a string too), so nothing a query could use is left out; in the definitions, strings
    are file paths (a string that is one word names a view: `query_table('metrics_wide')`), quoted
    names are columns and comments are prose. The audit helpers, the slowest views to define, are left
    out of a query that does not name them."""
    defining = {_DEFINED.search(st).group(1).lower(): st for st in statements}
    names = {name: set(_WORD.findall(_STRING.sub("", _COMMENT.sub("", st)).lower()))
                   | set(_NAMED.findall(_COMMENT.sub("", st).lower())) for name, st in defining.items()}
    todo, reached = set(_WORD.findall(uses.lower())) & set(defining), set()
    while todo:
        name = todo.pop()
        reached.add(name)
        todo |= (names[name] & set(defining)) - reached
    return [st for st in statements if _DEFINED.search(st).group(1).lower() in reached]


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Raise ReadOnlyViolation unless every statement in `sql` is a plain query."""
    import duckdb

    statements = con.extract_statements(sql)
    if not statements:
        raise ReadOnlyViolation("no SQL statement given")
    for st in statements:
        if st.type != duckdb.StatementType.SELECT:
            raise ReadOnlyViolation(f"only queries are allowed here, not {st.type.name}: {st.query.strip()[:60]}")


def query(root: str | Path, sql: str, timeout_s: float | None = TIMEOUT_S,
          memory_limit: str | None = MEMORY_LIMIT, snapshot: int | None = None,
          max_rows: int | None = MAX_ROWS, max_bytes: int | None = MAX_BYTES) -> tuple[list[str], Rows]:
    """Run a read-only query over the ledger views (of ledger snapshot `snapshot`, else the current
    one), bounded in time, memory, rows and bytes (see fetch_bounded); returns the last statement's
    (column names, rows). Raises ReadOnlyViolation, QueryTimeout, paths.SnapshotGone or duckdb.Error."""
    con = connect(root, memory_limit=memory_limit, uses=sql, snapshot=snapshot)
    try:
        check_read_only(con, sql)
        return fetch_bounded(con, sql, timeout_s, max_rows, max_bytes)
    finally:
        con.close()


class Rows(list):
    """A query's rows; `truncated`: more rows were there than the bounds let through (`why` says which bound)."""

    truncated: bool = False
    why: str = ""


def _size(v) -> int:
    """About how many bytes a fetched value takes (strings and blobs by their length, containers summed)."""
    if isinstance(v, (str, bytes, bytearray)):
        return len(v) + 8
    if isinstance(v, (list, tuple)):
        return 8 + sum(_size(x) for x in v)
    if isinstance(v, dict):
        return 8 + sum(_size(k) + _size(x) for k, x in v.items())
    return 16


def fetch_bounded(con: duckdb.DuckDBPyConnection, sql: str, timeout_s: float | None,
                  max_rows: int | None = None, max_bytes: int | None = None) -> tuple[list[str], Rows]:
    """Execute `sql` on `con` and fetch its rows, interrupted after `timeout_s` (None or 0: no limit),
    at most `max_rows` of them and about `max_bytes` (None: no limit): DuckDB streams the result, so
    the rows past the bounds are never made, in DuckDB or in Python (`rows.truncated` says so).
    Raises QueryTimeout when interrupted."""
    import duckdb

    timer = None
    if timeout_s:
        timer = threading.Timer(timeout_s, con.interrupt)
        timer.daemon = True
        timer.start()
    try:
        cur = con.execute(sql)
        columns = [d[0] for d in cur.description] if cur.description else []
        rows, size = Rows(), 0
        while cur.description:
            want = FETCH_CHUNK if max_rows is None else min(FETCH_CHUNK, max_rows + 1 - len(rows))
            chunk = cur.fetchmany(want)
            if not chunk:
                break
            if max_bytes is not None:
                for i, row in enumerate(chunk):
                    size += _size(row)
                    if size > max_bytes:
                        rows.extend(chunk[:i])
                        rows.truncated, rows.why = True, f"{max_bytes} bytes"
                        return columns, rows
            rows.extend(chunk)
            if max_rows is not None and len(rows) > max_rows:
                del rows[max_rows:]
                rows.truncated, rows.why = True, f"{max_rows} rows"
                break
        return columns, rows
    except duckdb.InterruptException:
        raise QueryTimeout(f"the query ran past its time limit of {timeout_s:g} s and was stopped") from None
    finally:
        if timer is not None:
            timer.cancel()


def load_query(name: str) -> str:
    """The text of a query file, e.g. load_query('health/grad_norm')."""
    return (HERE / f"{name}.sql").read_text()
