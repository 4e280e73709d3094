"""The audits: the health, provenance, forecast and fork suites of `.sql` files, run for one run or all.

`run_suite(root, 'health', run_id)` returns the rows of every `queries/health/*.sql` check, each
(run_id, check, status, value, threshold, at_step, evidence), and `fork` likewise (a fork against its
parent over a window of steps: Marin's go/no-go for a code cutover); provenance and forecast queries return
their own columns, one table per file; `format_audit` writes them as a table, JSON or CSV (the
command is `runledger audit`, in tools/audit.py).

The `.sql` files are plain queries over the views of views.sql and return every run; for one run
the views are opened over just the files its audit needs (`scope_files`: the run's own, its ladder
peers' and fork parent's where a check compares with them, every kind of its ancestors for the fork
suite), and the rows are filtered to the run.
Before a suite runs, the helper views (audit_runs, run_plan, run_thresholds, run_blocks, lr_segments,
step_cells, step_blocks, step_progress) are materialised as temp tables that shadow them, so the steps
are read once per suite (step_cells) rather than once per check. On a connection of its own the suite
materialises each helper as soon as views.sql defines it, so that the views after it are defined over
its small table rather than over everything below it.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from runledger import queries
from runledger.queries import forks
from runledger.ledger.storage import paths
from runledger.ledger.storage.paths import event_files
from runledger.queries.columns import envelope_columns, kind_columns, kind_views, kinds

log = logging.getLogger(__name__)

SUITES = ("health", "provenance", "forecast", "fork")
CHECKS = ("health", "fork")  # the suites whose rows are checks (HEALTH_COLUMNS): a fail fails the audit
HEALTH_COLUMNS = ("run_id", "check", "status", "value", "threshold", "at_step", "evidence")
STATUSES = ("ok", "warn", "fail", "skip")
# the helper views materialised before a suite, in dependency order
_HELPERS = ("run_plan", "run_thresholds", "run_blocks", "lr_segments", "step_cells", "step_blocks", "step_progress",
            "loss_changes", "loss_noise", "loss_noise_by_len")


@dataclass
class Result:
    """One query's answer: its name (the file's, e.g. 'health/lr_schedule'), columns and rows."""

    name: str
    columns: list[str]
    rows: list[tuple]
    seconds: float = 0.0


@dataclass
class Audit:
    suite: str
    run_id: str | None
    results: list[Result] = field(default_factory=list)

    def rows(self) -> list[dict]:
        return [dict(zip(r.columns, row)) for r in self.results for row in r.rows]

    @property
    def failed(self) -> bool:
        return self.suite in CHECKS and any(d.get("status") == "fail" for d in self.rows())


def query_names(suite: str) -> list[str]:
    """The queries of a suite, e.g. ['health/config_match', ...], in file-name order."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r} (suites: {', '.join(SUITES)})")
    return [f"{suite}/{p.stem}" for p in sorted((queries.HERE / suite).glob("*.sql"))]


def known_runs(root: Path) -> list[str]:
    """Every run with at least one event file (from the partition names: no file is opened)."""
    return sorted({p.parent.name.removeprefix("run_id=") for p in event_files(root)})


# the kinds a one-run audit also reads for related runs: ladder peers (drops_vs_ladder) and a fork's
# parent (checkpoint_lineage); forecasts are read whole (they belong to the ladder's run, and name
# their target); every other kind only for the run itself
PEER_KINDS = ("run_started", "drops")
PARENT_KINDS = ("run_started", "checkpoint")


def scope_files(root: Path, run_id: str, con: duckdb.DuckDBPyConnection | None = None,
                lineage: bool = False) -> dict[str, list[Path]]:
    """kind -> the Parquet files a one-run audit reads: the run's own, its ladder peers' run_started
    and drops (the same run_started.ladder name, or the rungs of a forecast for the run, as views.sql's
    ladder_peers finds them), its fork parent's run_started and checkpoints, and every forecast.
    With `lineage` (the fork suite), every kind of the runs its history forks from (runledger.queries.forks).
    The look-ups run on `con` when given (the connection the audit will use), else on one of their own."""
    root = Path(root)
    at = paths.cut(root)  # one snapshot for every listing below
    look = con or queries.open_connection()
    ladder, parents, peers = None, [], set()
    own_starts = event_files(root, "run_started", run_id, at=at)
    if own_starts:
        ladder, parents = look.execute(
            "select max(ladder ->> 'name'), list(distinct parent ->> 'run_id') "
            f"from {queries.scan_files(own_starts, kind_columns('run_started'))}").fetchone()
    if ladder is not None:  # only then read every run's run_started, for the same ladder name
        peers |= {r[0] for r in look.execute(
            f"select distinct run_id from {queries.scan_files(event_files(root, 'run_started', at=at), kind_columns('run_started'))} "
            "where ladder ->> 'name' = ?", [ladder]).fetchall()}
    forecasts = event_files(root, "forecast", at=at)
    if forecasts:
        peers |= {r[0] for r in look.execute(
            f"select distinct unnest(from_json(rungs, '[\"VARCHAR\"]')) from {queries.scan_files(forecasts, kind_columns('forecast'))} "
            "where target_run = ?", [run_id]).fetchall()}
    line = forks.lineage(root, run_id, look)[1:] if lineage else []
    if con is None:
        look.close()
    peers.discard(run_id)
    parents = {p for p in parents or [] if p and p != run_id}
    files = {}
    for kind in kinds():
        if kind == "forecast":
            files[kind] = forecasts
            continue
        runs = [run_id, *sorted(peers if kind in PEER_KINDS else []), *sorted(parents if kind in PARENT_KINDS else []), *line]
        files[kind] = [f for r in dict.fromkeys(runs) for f in event_files(root, kind, r, at=at)]
    log.debug("scope of %s: ladder peers %s, parents %s", run_id, sorted(peers), sorted(parents))
    return files


def scope_to_run(con: duckdb.DuckDBPyConnection, root: Path, run_id: str, lineage: bool = False) -> None:
    """On a connection over the whole ledger, shadow the kind views (and `events`) with temp views over
    the files of `scope_files`, so that a one-run audit opens no unrelated run's files."""
    files = scope_files(root, run_id, con, lineage)
    cols = ", ".join(envelope_columns())
    for kind, view in kind_views().items():
        con.execute(f"create or replace temp view {view} as select * from {queries.scan_files(files[kind], kind_columns(kind))}")
    union = " union all ".join(f"select {cols} from {queries.scan_files(f, kind_columns(k))}" for k, f in files.items() if f)
    empty = queries.scan_files([], kind_columns("step"))
    con.execute(f"create or replace temp view events as {union or f'select {cols} from {empty}'}")


def shadow(con: duckdb.DuckDBPyConnection, name: str, runs: list[str]) -> None:
    """Materialise audit helper `name` as a temp table that shadows its view: audit_runs holds `runs`,
    the others their view's rows (over the temp tables before them). Anything else is left alone."""
    if name == "audit_runs":
        con.execute("create temp table audit_runs (run_id varchar)")
        if runs:
            con.execute("insert into audit_runs values " + ", ".join(f"({queries.sql_str(r)})" for r in runs))
    elif name in _HELPERS:
        t0 = time.perf_counter()
        # `main.x` would find a temp x first
        db = con.execute("select current_database()").fetchone()[0]
        con.execute(f"create temp table {name} as select * from {db}.main.{name}")
        log.debug("materialised %s in %.3fs", name, time.perf_counter() - t0)


def prepare(con: duckdb.DuckDBPyConnection, root: Path, run_id: str | None, scoped: bool = False,
            lineage: bool = False) -> None:
    """Materialise the audit helpers as temp tables, for `run_id` or for every run. A connection over
    the whole ledger is first scoped to the run; `scoped` says it was opened over the run's files."""
    # a connection reused for another scope starts afresh: `main.x` would find a temp x first
    for view in ("events", *kind_views().values()):
        con.execute(f"drop view if exists temp.{view}")
    for table in ("audit_runs", *_HELPERS):
        con.execute(f"drop table if exists temp.{table}")
    if run_id and not scoped:
        scope_to_run(con, root, run_id, lineage)
    runs = [run_id] if run_id else known_runs(root)
    for name in ("audit_runs", *_HELPERS):
        shadow(con, name, runs)


def run_suite(root: str | Path, suite: str, run_id: str | None = None,
              con: duckdb.DuckDBPyConnection | None = None, threads: int | None = None,
              only: tuple[str, ...] | None = None) -> Audit:
    """Run every query of `suite` (or those whose file names `only` lists, e.g. ('loss_spike',)) for `run_id`
    (or all runs); health rows are sorted by run and check.

    Without `con`, opens a read-only connection: over the run's files (see scope_files) when there is
    a run, else over the whole ledger. A `con` over the whole ledger is reused (scoped with temp views).
    """
    root = Path(root)
    names = [n for n in query_names(suite) if only is None or n.split("/", 1)[1] in only]
    t0 = time.perf_counter()
    if con is None:  # a connection of our own: over just the run's files when there is a run, its helpers
        # materialised as views.sql defines them
        runs = [run_id] if run_id else known_runs(root)
        own = queries.open_connection(threads)
        con = queries.connect(root, files=scope_files(root, run_id, own, suite == "fork") if run_id else None,
                              on_view=lambda c, name: shadow(c, name, runs), con=own)
    else:
        prepare(con, root, run_id, lineage=suite == "fork")
    log.info("audit %s %s: helpers ready in %.3fs", suite, run_id or "(all runs)", time.perf_counter() - t0)
    audit = Audit(suite, run_id)
    for name in names:
        t1 = time.perf_counter()
        sql = queries.load_query(name)
        if run_id and suite not in CHECKS:
            cur = con.execute(f"select * from ({sql}) where run_id = ?", [run_id])
        else:  # a health row leads with its run_id: kept here, rather than by a filter DuckDB plans through every check
            cur = con.execute(sql)
        columns = [d[0] for d in cur.description]
        rows = cur.fetchall()
        if suite in CHECKS:
            _check_shape(name, columns, rows)
            rows = sorted((r for r in rows if run_id is None or r[0] == run_id), key=lambda r: (r[0], r[1]))
        audit.results.append(Result(name, columns, rows, time.perf_counter() - t1))
        log.debug("%s: %d rows in %.3fs", name, len(rows), time.perf_counter() - t1)
    log.info("audit %s %s: %d queries in %.3fs", suite, run_id or "(all runs)", len(names), time.perf_counter() - t0)
    return audit


def _check_shape(name: str, columns: list[str], rows: list[tuple]) -> None:
    if tuple(columns) != HEALTH_COLUMNS:
        raise ValueError(f"{name} returns columns {columns}, a health check returns {list(HEALTH_COLUMNS)}")
    bad = {r[2] for r in rows} - set(STATUSES)
    if bad:
        raise ValueError(f"{name} returns statuses {sorted(bad)}, not one of {STATUSES}")


# ------------------------------------------------------------------------------------- output
def cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def format_audit(audit: Audit, fmt: str) -> str:
    """The audit as a table (one per query, or one for health), JSON or CSV text."""
    if audit.suite in CHECKS:
        results = [Result(audit.suite, list(HEALTH_COLUMNS), [r for res in audit.results for r in res.rows])]
    else:
        results = audit.results
    if fmt == "json":
        if audit.suite in CHECKS:
            return json.dumps(audit.rows(), default=str, indent=1)
        return json.dumps({r.name: [dict(zip(r.columns, row)) for row in r.rows] for r in results}, default=str, indent=1)
    out = io.StringIO()
    if fmt == "csv":
        for r in results:
            if audit.suite not in CHECKS:
                out.write(f"# {r.name}\n")
            w = csv.writer(out, lineterminator="\n")
            w.writerow(r.columns)
            w.writerows([[("" if v is None else v) for v in row] for row in r.rows])
        return out.getvalue()
    for r in results:
        cells = [[cell(v) for v in row] for row in r.rows]
        widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(r.columns)]
        widths = [min(w, 120) for w in widths]
        if audit.suite not in CHECKS:
            out.write(f"{r.name} ({len(r.rows)} rows)\n")
        out.write("  ".join(c.ljust(w) for c, w in zip(r.columns, widths)).rstrip() + "\n")
        out.write("  ".join("-" * w for w in widths) + "\n")
        for row in cells:
            out.write("  ".join(c[:w].ljust(w) for c, w in zip(row, widths)).rstrip() + "\n")
        out.write("\n")
    return out.getvalue()
