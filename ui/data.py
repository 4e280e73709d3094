"""What the dashboard reads: one long-lived read-only DuckDB connection with the views of `runledger sql`
(queries/views.sql), and the queries of its pages (the `.sql` files beside this one), including the min/max
downsampling that keeps every spike.

Every read takes a cursor of its own on which the kind views (and `events`) are shadowed by temp views
over the files of the current ledger snapshot for just the runs it is about (`scoped`): each query
binds every file of the views it reads, and a ledger of thousands of runs has thousands of files per
kind, so a run's page reads its own files only. A read lists its snapshot when it starts, so it never
fails while the ledger writes or compacts (files a newer snapshot dropped are kept for readers a while:
runledger.ledger.storage.tables).

What does not change is kept, by the files it was read from (a file never changes once written;
compaction writes new ones), in memory and in the user's cache folder (`runledger.ledger.settings.cache_dir`), so
that a restart, or a new file, costs only the new files: the runs page's parts of each file (one
grouped query per kind over the files not seen yet, projected to the few columns the list shows; the
rows of ui/runs.sql are put together from them), and the answers of `series` (a big run's min/max pass).
The health counts of the runs page come from one pass of the health suite over all the rows shown.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import duckdb

from runledger import queries
from runledger.ledger.ingest import partitions
from runledger.ledger.storage import paths
from runledger.ledger import settings
from runledger.ledger.contract.metricnames import metric_name
from runledger.ledger.contract.roles import is_person
from runledger.queries.columns import envelope_columns, kind_columns, kind_views, kinds

log = logging.getLogger(__name__)
HERE = Path(__file__).parent

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
MAX_SQL_ROWS = 10_000  # rows the SQL console fetches and shows (it says when there were more)
MAX_SQL_BYTES = 16 * 2**20  # ... and about bytes
MAX_LIVE_ROWS = 50_000  # events one live push reads; past it the page is told to draw itself again
_MISSING = object()
SERIES_KEPT = 64  # answers of `series` kept (each at most a few pixels' worth of points per key)
FIRST_PAGE = 100  # rows of the runs page drawn at a time (app.js PAGE_ROWS): their health counts are worked out at start
SILENT_S = 600.0  # Marin: telemetry silent > 10 min (queries/thresholds.py silence_max_s's default)


def load(name: str) -> str:
    """The text of one of the dashboard's queries, e.g. load('runs')."""
    return (HERE / f"{name}.sql").read_text()


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _jsonable(v):
    if isinstance(v, float) and v != v:  # NaN cannot be JSON
        return None
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if isinstance(v, Decimal):
        return float(v)
    return v


def rows_of(cur: duckdb.DuckDBPyConnection) -> list[dict]:
    cols = [d[0] for d in cur.description]
    return [{c: _jsonable(v) for c, v in zip(cols, r)} for r in cur.fetchall()]


class Reader:
    """The dashboard's view of one ledger root."""

    def __init__(self, root: str | Path, threads: int | None = None):
        self.root = Path(root).resolve()
        self._lock = threading.Lock()
        self._cursor_lock = threading.Lock()
        self.positions = partitions.positions(self.root)  # the ledger's, or each partition's (see `position_of`)
        self.position = max(self.positions.values(), default=0)
        # the views of views.sql over no files: every read shadows the kind views with temp views over
        # the files of the runs it is about, listed from the current snapshot (`scoped`)
        self.con = queries.connect(self.root, threads=threads, memory_limit=queries.MEMORY_LIMIT, files={})
        self._audits: dict[tuple[str, str], tuple[frozenset, list]] = {}  # (run, suite) -> (its files, rows)
        self._audit_lock = threading.Lock()
        self._series: dict[tuple, dict] = {}  # answers of `series`, by their files (oldest first)
        self._summary: dict[str, dict] = {}  # the runs page's rows, by run
        self._summary_sig: dict[str, frozenset] = {}  # the files each row was summarised from
        self._summary_lock = threading.Lock()
        self._parts: dict[str, list] = {}  # str(path) -> [its size:mtime, kind, its parts] (`file_parts`)
        self._load_parts()
        self._health: dict[str, tuple[frozenset, dict]] = {}  # run -> (its files and the forecasts, its counts)
        self._health_lock = threading.Lock()
        self._health_loaded = False
        self.threads = threads

    def close(self) -> None:
        self.con.close()

    # ------------------------------------------------------------------------------ snapshots
    def refresh(self, force: bool = False) -> bool:
        """Take the ledger's new positions, if one moved; True if one did. (Each read lists the files of
        the snapshot current when it starts, so nothing else is to be moved.)"""
        with self._lock:
            positions = partitions.positions(self.root)
            if positions == self.positions and not force:
                return False
            self.positions, self.position = positions, max(positions.values(), default=0)
            return True

    def position_of(self, run_id: str) -> int:
        """How far the stream is stored for this run's events (its partition's position on a partitioned root)."""
        return partitions.stored_upto(self.positions, run_id)

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

    # ------------------------------------------------------------------------------ scopes
    def run_files(self) -> dict[str, dict[str, list[Path]]]:
        """run_id -> kind -> its event files in the ledger's current snapshot (no file is opened)."""
        at = paths.cut(self.root) if paths.is_tables(self.root) else None
        out: dict[str, dict[str, list[Path]]] = {}
        for kind in kinds():
            for f in paths.event_files(self.root, kind, at=at):
                out.setdefault(f.parent.name.removeprefix("run_id="), {}).setdefault(kind, []).append(f)
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

    # ------------------------------------------------------------------------------ runs page
    # What the runs page needs of each event file, by kind: one grouped query over every file not yet
    # seen (projected to these columns), one row per file and run. A file never changes once written
    # (compaction writes new ones), so each answer is kept by the file's path, size and mtime, in
    # memory and in the user's cache folder: a restart, or a new file, costs only the files not seen yet.
    # The rows of ui/runs.sql are then put together from the files' parts (`_merge`): the same answer.
    _FILE_PARTS = {
        "run_started": "select filename, run_id, epoch_us(min(ts)) as first_us, epoch_us(max(ts)) as last_us, "
                       "arg_min(project, ts) as project, arg_min(tags, ts) as tags, arg_min(config, ts) as config, "
                       "arg_min(preset, ts) as preset, arg_min(ladder ->> 'name', ts) as ladder, "
                       "list(distinct parent ->> 'run_id') filter (parent is not null) as parents, "
                       "list(distinct attempt) as attempts",
        "step": "select filename, run_id, max(step) as last_step, epoch_us(max(ts)) as last_us, count(*) as steps",
        "metrics": "select filename, run_id, max(step) as last_step, epoch_us(max(ts)) as last_us, count(*) as steps",
        "run_finished": "select filename, run_id, arg_max(status, ts) as status, epoch_us(max(ts)) as last_us",
        "alert": "select filename, run_id, list([alert_id, producer, stream_seq::varchar, seq::varchar, state, severity]) as alerts",
    }
    _PARTS_VERSION = hashlib.sha256(json.dumps(_FILE_PARTS, sort_keys=True).encode()).hexdigest()[:12]

    def _parts_cache(self) -> Path:
        """Where the files' parts are kept between starts (the user's cache: worked out again if lost)."""
        ident = hashlib.sha256(str(self.root).encode()).hexdigest()[:16]
        return settings.cache_dir() / "ui" / f"files-{ident}-{self._PARTS_VERSION}.json"

    def _health_cache(self) -> Path:
        """Where the health counts are kept between starts (named by the checks' SQL: counts of other checks are not read)."""
        checks = hashlib.sha256(b"".join(p.read_bytes() for p in sorted((queries.HERE / "health").glob("*.sql")))
                                + (queries.HERE / "views.sql").read_bytes()).hexdigest()[:12]
        return self._parts_cache().with_name(self._parts_cache().name.replace("files-", f"health-{checks}-"))

    @staticmethod
    def _write_cache(path: Path, data) -> None:
        try:  # written whole (temp file, rename) or not at all
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, path)
        except OSError as err:
            log.debug("%s is not kept (%s)", path.name, err)

    def _load_parts(self) -> None:
        try:
            found = json.loads(self._parts_cache().read_text())
        except (OSError, ValueError):
            return
        if isinstance(found, dict):
            self._parts.update({p: v for p, v in found.items() if isinstance(v, list) and len(v) == 3})

    def _save_parts(self) -> None:
        self._write_cache(self._parts_cache(), self._parts)

    def file_parts(self, files: dict[str, dict[str, list[Path]]]) -> dict[str, list[dict]]:
        """str(path) -> that file's parts (rows of _FILE_PARTS, one per run in it), for the files of the
        kinds the runs page reads; read only for the files not seen before (one query per kind)."""
        out: dict[str, list[dict]] = {}
        todo: dict[str, list[str]] = {}
        idents: dict[str, str] = {}
        for kind in self._FILE_PARTS:
            for run in files.values():
                for f in run.get(kind, []):
                    p = str(f)
                    try:
                        st = f.stat()
                    except OSError:  # dropped by a compaction since the listing: the next listing has its successor
                        continue
                    ident = f"{st.st_size}:{st.st_mtime_ns}"
                    kept = self._parts.get(p)
                    if kept is not None and kept[0] == ident:
                        out[p] = kept[2]
                    else:
                        todo.setdefault(kind, []).append(p)
                        idents[p] = ident
        for kind, paths_ in todo.items():
            t0 = time.perf_counter()
            scan = ", ".join(queries.sql_str(p) for p in paths_)
            with self.cursor() as cur:
                # the columns by their names across files of one schema (the common case: each footer read
                # once), else unified over files whose columns differ (metrics: each footer read twice)
                for by_name in ("false", "true"):
                    try:
                        got = rows_of(cur.execute(f"{self._FILE_PARTS[kind]} from read_parquet([{scan}], union_by_name="
                                                  f"{by_name}, hive_partitioning=false, filename=true) group by filename, run_id"))
                        break
                    except (duckdb.BinderException, duckdb.InvalidInputException) as err:
                        if by_name == "true":
                            raise
                        log.debug("%s: files of more than one schema (%s)", kind, str(err).splitlines()[0])
            parts: dict[str, list[dict]] = {p: [] for p in paths_}
            for row in got:
                parts.setdefault(row.pop("filename"), []).append(row)
            for p in paths_:  # (kept once read: a query that failed, e.g. a file a compaction removed, is tried again)
                out[p] = parts.get(p, [])
                self._parts[p] = [idents[p], kind, out[p]]
            log.debug("%s: %d new files read in %.3fs", kind, len(paths_), time.perf_counter() - t0)
        if todo:
            self._save_parts()
        return out

    @staticmethod
    def _merge(by_kind: dict[str, list[dict]]) -> dict | None:
        """One run's row of the runs page from its files' parts (the same row as ui/runs.sql's)."""
        starts = by_kind.get("run_started", [])
        if not starts:
            return None
        first = min(starts, key=lambda s: s["first_us"])
        last_start = max(s["last_us"] for s in starts)
        stepped = by_kind.get("step", []) + by_kind.get("metrics", [])
        steps = [s["last_step"] for s in stepped if s["last_step"] is not None]
        step_us = [s["last_us"] for s in stepped if s["last_us"] is not None]
        finished = [f for f in by_kind.get("run_finished", []) if f["last_us"] is not None]
        fin = max(finished, key=lambda f: f["last_us"]) if finished else None
        # the open_alerts view's rule: an alert is (alert_id, producer)'s, closed by a later resolution of
        # its producer or of a person
        raised: dict[tuple, tuple] = {}  # (alert_id, producer) -> ((stream_seq, seq), severity) of its latest raising
        resolutions: dict[str, list] = {}  # alert_id -> [(producer, (stream_seq, seq))]
        for part in by_kind.get("alert", []):
            for alert_id, producer, stream_seq, seq, state, severity in part["alerts"]:
                at = (int(stream_seq), int(seq))
                if state != "open":
                    resolutions.setdefault(alert_id, []).append((producer, at))
                elif (alert_id, producer) not in raised or at > raised[alert_id, producer][0]:
                    raised[alert_id, producer] = (at, severity)
        open_ = [severity for (alert_id, producer), (at, severity) in raised.items()
                 if not any(when > at and (by == producer or is_person(by)) for by, when in resolutions.get(alert_id, ()))]
        last_event = max([last_start] + ([max(step_us)] if step_us else []) + ([fin["last_us"]] if fin else []))
        return {
            "run_id": first["run_id"], "project": first["project"], "preset": first["preset"], "ladder": first["ladder"],
            "attempts": len({a for s in starts for a in s["attempts"]}),
            "tags": json.loads(first["tags"]) if first["tags"] else [], "config": first["config"],
            "finished": fin["status"] if fin else None, "last_step": max(steps) if steps else None,
            "steps": sum(s["steps"] for s in stepped), "started_at": _iso(first["first_us"]), "last_event": _iso(last_event),
            "alerts_warn": open_.count("warn"), "alerts_fail": open_.count("fail"),
            "parents": sorted({p for s in starts for p in s["parents"] or [] if p}),
        }

    def summaries(self) -> dict[str, dict]:
        """run_id -> its row of the runs page (ui/runs.sql's), put together again only for the runs whose
        files changed, from the parts of each file (`file_parts`: only new files are read)."""
        with self._summary_lock:
            files = self.run_files()
            signature = {r: frozenset(f for fs in k.values() for f in fs) for r, k in files.items()}
            changed = [r for r, sig in signature.items() if self._summary_sig.get(r) != sig]
            for gone in set(self._summary) - set(signature):
                self._summary.pop(gone, None)
                self._summary_sig.pop(gone, None)
            listed = {str(f) for sig in signature.values() for f in sig}
            for gone in [p for p in self._parts if p not in listed and not os.path.exists(p)]:
                self._parts.pop(gone)  # (files a compaction replaced, once the ledger removed them)
            if changed:
                t0 = time.perf_counter()
                parts = self.file_parts({r: files[r] for r in changed})
                for r in changed:
                    by_kind = {kind: [row for f in files[r].get(kind, []) for row in parts.get(str(f), [])
                                      if row["run_id"] == r] for kind in self._FILE_PARTS}
                    row = self._merge(by_kind)
                    if row is None:
                        self._summary.pop(r, None)
                    else:
                        self._summary[r] = row
                    self._summary_sig[r] = signature[r]
                log.debug("runs summarised again: %d in %.3fs", len(changed), time.perf_counter() - t0)
            return self._summary

    def prime(self, rows: int = FIRST_PAGE) -> None:
        """Work out the runs page's rows, then the health counts of the newest `rows` runs (its first page)."""
        self.health([r["run_id"] for r in self.runs(limit=rows)])

    def health(self, run_ids: list[str]) -> dict[str, dict]:
        """run_id -> its health checklist's counts {ok, warn, fail, skip} (the runs page's column), for
        every run asked: the runs not counted yet (or whose files, or the forecasts, changed since) in
        one pass of the health suite over all of them at once (queries/health/*.sql over the files of
        those runs and of what their checks compare with: `health_scope`), not one audit per run."""
        from runledger.queries.audit import STATUSES, shadow, query_names

        files = self.run_files()
        forecasts = frozenset(f for r in files.values() for f in r.get("forecast", []))
        keys = {r: frozenset(f for fs in files.get(r, {}).values() for f in fs) | forecasts for r in dict.fromkeys(run_ids)}
        with self._health_lock:
            if not self._health_loaded:  # the counts an earlier start kept, by the same files
                self._health_loaded = True
                try:
                    for r, (k, c) in json.loads(self._health_cache().read_text()).items():
                        self._health[r] = (frozenset(k), c)
                except (OSError, ValueError, TypeError):
                    pass
            keys = {r: frozenset(map(_identity, k)) for r, k in keys.items()}
            todo = [r for r, k in keys.items() if r in files and self._health.get(r, (None,))[0] != k]
            if todo:
                t0 = time.perf_counter()
                counts = {r: dict.fromkeys(STATUSES, 0) for r in todo}
                own = queries.open_connection(self.threads)
                try:
                    con = queries.connect(self.root, files=self.health_scope(todo, files), con=own,
                                          on_view=lambda c, name: shadow(c, name, todo))
                    for name in query_names("health"):
                        for run, status in con.execute(f"select run_id, status from ({queries.load_query(name)})").fetchall():
                            if run in counts and status in counts[run]:
                                counts[run][status] += 1
                finally:
                    own.close()
                for r in todo:
                    self._health[r] = (keys[r], counts[r])
                log.debug("health of %d runs in %.3fs", len(todo), time.perf_counter() - t0)
                self._write_cache(self._health_cache(), {r: [sorted(k), c] for r, (k, c) in self._health.items()})
            return {r: self._health[r][1] for r in keys if r in self._health}

    def health_scope(self, run_ids: list[str], files: dict[str, dict[str, list[Path]]]) -> dict[str, list[Path]]:
        """kind -> the files the health checks of `run_ids` read (runledger.queries.audit.scope_files for many runs at
        once): the runs' own, their ladder peers' run_started and drops, their fork parents' run_started and
        checkpoints, and every forecast (the peers found from the runs page's rows and the forecasts' rungs)."""
        from runledger.queries.audit import PARENT_KINDS, PEER_KINDS

        rows = self.summaries()
        ladders = {rows[r]["ladder"] for r in run_ids if r in rows and rows[r]["ladder"] is not None}
        peers = {r for r, row in rows.items() if row["ladder"] in ladders}
        parents = {p for r in run_ids if r in rows for p in rows[r]["parents"]}
        forecasts = [f for r in files.values() for f in r.get("forecast", [])]
        if forecasts:
            with self.cursor() as cur:
                peers |= {r[0] for r in cur.execute(
                    f"select distinct unnest(from_json(rungs, '[\"VARCHAR\"]')) from "
                    f"{queries.scan_files(forecasts, kind_columns('forecast'))} where list_contains($runs, target_run)",
                    {"runs": list(run_ids)}).fetchall()}
        out = {}
        for kind in kinds():
            if kind == "forecast":
                out[kind] = forecasts
                continue
            runs = [*run_ids, *sorted(peers if kind in PEER_KINDS else []), *sorted(parents if kind in PARENT_KINDS else [])]
            out[kind] = [f for r in dict.fromkeys(runs) for f in files.get(r, {}).get(kind, [])]
        return out

    def runs(self, name: str = "", tag: str = "", status: str = "", config: str = "", limit: int = 5000) -> list[dict]:
        """The runs page's rows, newest first, filtered by a part of the name, a tag, a status and a
        config key=value (a dotted key; the value compared as JSON, else as text)."""
        key, _, value = config.partition("=")
        key, value = key.strip(), value.strip()
        if key and not re.fullmatch(r"[A-Za-z0-9_.\-]{1,200}", key):
            raise ValueError(f"config filter {config!r}: KEY=VALUE with a dotted key of letters, digits, _ - .")
        now = datetime.now(timezone.utc).timestamp()
        out = []
        for row in self.summaries().values():
            last = datetime.fromisoformat(row["last_event"]).timestamp() if row["last_event"] else None
            age = None if last is None else round(now - last, 1)
            state = row["finished"] or ("silent" if age is not None and age > SILENT_S else "running")
            if (name and name.lower() not in row["run_id"].lower()) or (tag and tag not in (row["tags"] or [])) \
                    or (status and status != state):
                continue
            if key:
                found = flatten(json.loads(row["config"] or "{}")).get(key, _MISSING)
                if found is _MISSING or (json.dumps(found) != value and str(found) != value):
                    continue
            out.append({k: v for k, v in row.items() if k not in ("config", "finished", "parents")} | {"status": state, "age_s": age})
        out.sort(key=lambda r: (r["started_at"] or "", r["run_id"]), reverse=True)
        return out[:limit]

    # ------------------------------------------------------------------------------ one run
    # (each reads on a cursor scoped to the run: `scoped`, given as `cur` or opened here)
    def keys(self, run_id: str, cur=None) -> dict[str, list[str]]:
        """source -> the keys (columns) this run has at least one number in."""
        if cur is None:
            with self.scoped([run_id]) as cur:
                return self.keys(run_id, cur)
        out = {}
        for source, (view, x, _) in SOURCES.items():
            cols = self.numeric_columns(source, cur)
            if source in ("metrics", "system"):  # a name's column is in the run's files only if it logged it
                if cols:
                    out[source] = [self.key_name(source, c) for c in cols]
                continue
            if not cols:
                continue
            counts = ", ".join(f"count({_quote(c)})" for c in cols)
            row = cur.execute(f"select {counts} from {view} where run_id = ?", [run_id]).fetchone()
            keys = [self.key_name(source, c) for c, n in zip(cols, row) if n]
            if keys:
                out[source] = keys
        return out

    @staticmethod
    def numeric_columns(source: str, cur) -> list[str]:
        view = SOURCES[source][0]
        if source in ("metrics", "system"):
            return [r[0] for r in cur.execute(f"describe {view}").fetchall() if _METRIC_COLUMN.match(r[0])]
        kind = {"step_events": "step", "eval_events": "eval"}[view]
        envelope = set(envelope_columns())
        return [c for c, t in kind_columns(kind) if t in _NUMERIC and c not in envelope]

    @staticmethod
    def key_name(source: str, column: str) -> str:
        return metric_name(column) if source in ("metrics", "system") else column

    def columns_of(self, source: str, keys: list[str], cur) -> list[str]:
        """The stored columns of chart keys (refuses one the view does not have: nothing else reaches the SQL)."""
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r} (one of {', '.join(SOURCES)})")
        known = {self.key_name(source, c): c for c in self.numeric_columns(source, cur)}  # (a name's column: escaped)
        for key in keys:
            if key not in known:
                raise KeyError(f"no {source} key {key!r}")
        return [known[key] for key in keys]

    def run_info(self, run_id: str) -> dict:
        """What the run's page shows first: its attempts, chart keys, decision trail, forecast band."""
        with self.scoped([run_id]) as cur:
            return {"run_id": run_id, "attempts": rows_of(cur.execute(load("run_attempts"), {"run": run_id})),
                    "keys": self.keys(run_id, cur), "decisions": self.decisions(run_id, cur),
                    "forecast": rows_of(cur.execute(load("forecast_band"), {"run": run_id})), "position": self.position}

    def series(self, run_id: str, source: str, keys: list[str], px: int = 600,
               x0: float | None = None, x1: float | None = None) -> dict:
        """The points of `keys` of one source, per attempt, downsampled in SQL: per pixel bucket of x and
        attempt, the smallest and the largest value, each at its own x (so every spike stays, up or
        down); a bucket holding one point gives that point, so a zoomed range with fewer points than
        pixels is exact. Never sampled.
        Returns {"keys": {key: {attempt: [[x...], [y...]]}}, "x": [lo, hi], "rows": n, "seq": max stream_seq}."""
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r} (one of {', '.join(SOURCES)})")
        view, x, min_width = SOURCES[source]
        files = self.run_files()
        key = (run_id, source, tuple(keys), int(px), x0, x1, frozenset(files.get(run_id, {}).get(SOURCE_KINDS[source], [])))
        if key in self._series:  # the same points of the same files: a finished run's page opened again
            return self._series[key]
        # ... or by an earlier start of the dashboard: the answer is kept in the cache folder by its files' paths
        # (a file never changes once written), so a restart does not read a big run's millions of rows again
        kept = self._series_dir() / (hashlib.sha256(json.dumps(
            [*key[:6], sorted(map(_identity, key[6])), self._PARTS_VERSION]).encode()).hexdigest()[:32] + ".json")
        try:
            out = json.loads(kept.read_text())
        except (OSError, ValueError):
            out = None
        if not (isinstance(out, dict) and isinstance(out.get("keys"), dict) and set(out["keys"]) == set(keys)):
            with self.scoped([run_id], files=files) as cur:
                cols = self.columns_of(source, keys, cur)
                out = self._minmax(cur, f"select attempt as grp, {x} as x, stream_seq, {', '.join(_quote(c) for c in cols)} "
                                    f"from {view} where run_id = $run and {x} is not null",
                               {"run": run_id}, cols, keys, px, x0, x1, min_width)
            self._keep_series(kept, out)
        while len(self._series) >= SERIES_KEPT:
            self._series.pop(next(iter(self._series)))
        self._series[key] = out
        return out

    def _series_dir(self) -> Path:
        return self._parts_cache().with_name(self._parts_cache().stem.replace("files-", "series-"))

    def _keep_series(self, path: Path, out: dict) -> None:
        """Keep one answer of `series` in the cache folder (the SERIES_KEPT newest; written whole or not at all)."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
            tmp.write_text(json.dumps(out, default=_jsonable))
            os.replace(tmp, path)
            kept = sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
            for old in kept[:-SERIES_KEPT]:
                old.unlink(missing_ok=True)
        except OSError as err:
            log.debug("a series answer is not kept (%s)", err)

    def layer_drops(self, run_id: str, px: int = 600, x0: float | None = None, x1: float | None = None) -> dict:
        """Drop fraction per layer and attempt (group "ATTEMPT:LAYER"; layer -1: the run's total where no layers were sent)."""
        with self.scoped([run_id]) as cur:
            return self._minmax(cur, f"select attempt || ':' || layer as grp, step as x, stream_seq, drop_fraction "
                                 f"from ({load('layer_drops')})",
                            {"run": run_id}, ["drop_fraction"], ["drop_fraction"], px, x0, x1, 1.0)

    @staticmethod
    def _minmax(cur, relation: str, params: dict, cols: list[str], keys: list[str], px: int,
            x0: float | None, x1: float | None, min_width: float) -> dict:
        px = max(8, min(int(px), 4000))
        lo, hi, seq, n = cur.execute(f"select min(x), max(x), max(stream_seq), count(*) from ({relation})",
                                     params).fetchone()
        lo, hi = (lo if x0 is None else x0), (hi if x1 is None else x1)
        out: dict[str, dict] = {k: {} for k in keys}
        if lo is None or hi is None:
            return {"keys": out, "x": [lo, hi], "seq": seq or 0, "rows": n or 0}
        width = max((hi - lo) / px, min_width)
        aggs = []
        for c in map(_quote, cols):  # per bucket: the lowest and the highest value, each at its x
            aggs += [f"arg_min(x, {c})", f"min({c})", f"arg_max(x, {c})", f"max({c})"]
        res = cur.execute(f"select grp, floor((x - $lo) / $w)::bigint as bucket, {', '.join(aggs)} from ({relation}) "
                          "where x between $lo and $hi group by all order by grp, bucket",
                          {**params, "lo": lo, "hi": hi, "w": width}).fetchall()
        for row in res:
            grp, vals = str(row[0]), row[2:]
            for i, k in enumerate(keys):
                v = vals[4 * i:4 * i + 4]
                pts = sorted({(x, y) for x, y in zip(v[0::2], v[1::2]) if y is not None})
                if not pts:
                    continue
                xs, ys = out[k].setdefault(grp, ([], []))
                for x, y in pts:  # (two values at one x, e.g. a step logged twice: both extremes kept)
                    xs.append(x)
                    ys.append(y)
        return {"keys": out, "x": [lo, hi], "seq": seq or 0, "rows": n or 0}

    def new_points(self, run_id: str, since: int, upto: int | None = None) -> dict:
        """Every number of the run stored after stream seq `since` up to the ledger's position, exact:
        {source: {key: {attempt: [[x], [y]]}}}, the drops per layer, and the kinds of the other events
        that came (decisions, alerts ...); "seq": the position, where the next call starts.
        Only up to the position (of the run's partition, on a partitioned root): the ledger writes it
        after committing everything below it, while the tables of one commit become readable one kind
        after another, so a later event of one kind can be readable before an earlier one of another
        (a cursor at the greatest seq read would skip that one). `upto`: stop there, if the position is past it."""
        upto = min(self.position_of(run_id), upto if upto is not None else float("inf"))  # (read before the
        # snapshot's files are listed: they hold all of it)
        out: dict = {"seq": max(since, upto), "kinds": []}
        if upto <= since:
            return out
        with self.scoped([run_id]) as cur:
            counts = dict(cur.execute("select kind, count(*) from events where run_id = ? and stream_seq > ? "
                                      "and stream_seq <= ? group by kind", [run_id, since, upto]).fetchall())
            out["kinds"] = list(counts)
            if sum(counts.values()) > MAX_LIVE_ROWS:  # (a page far behind: it draws itself again, at the pixels' resolution)
                out["reload"] = True
                return out
            for source, (view, x, _) in SOURCES.items():
                if SOURCE_KINDS[source] not in out["kinds"]:
                    continue
                cols = self.numeric_columns(source, cur)
                cur.execute(f"select attempt, {x}, stream_seq, {', '.join(_quote(c) for c in cols)} from {view} "
                            f"where run_id = ? and stream_seq > ? and stream_seq <= ? and {x} is not null order by stream_seq",
                            [run_id, since, upto])
                for row in cur.fetchall():
                    for c, v in zip(cols, row[3:]):
                        if v is not None:
                            xs, ys = out.setdefault(source, {}).setdefault(self.key_name(source, c), {}).setdefault(
                                str(row[0]), ([], []))
                            xs.append(row[1])
                            ys.append(v)
            if "drops" not in out["kinds"]:
                return out
            for grp, step, frac, seq in cur.execute(
                    f"select attempt || ':' || layer, step, drop_fraction, stream_seq from ({load('layer_drops')}) "
                    "where stream_seq > $since and stream_seq <= $upto order by stream_seq",
                    {"run": run_id, "since": since, "upto": upto}).fetchall():
                xs, ys = out.setdefault("drops", {}).setdefault(grp, ([], []))
                xs.append(step)
                ys.append(frac)
        return out

    def decisions(self, run_id: str, cur=None) -> list[dict]:
        if cur is None:
            with self.scoped([run_id]) as cur:
                return self.decisions(run_id, cur)
        out = rows_of(cur.execute(load("decisions"), {"run": run_id}))
        for d in out:
            for k in ("params", "evidence", "before", "after"):
                if isinstance(d.get(k), str):
                    try:
                        d[k] = json.loads(d[k])
                    except ValueError:
                        pass
        return out

    def audit(self, run_id: str, suite: str) -> list[dict]:
        """The run's health checklist (or provenance / forecast tables): computed again only when the
        run's files or the forecasts changed, and one audit at a time (a page of runs asks for several)."""
        from runledger.queries.audit import run_suite

        files = self.run_files()
        key = frozenset(f for kind, fs in files.get(run_id, {}).items() for f in fs) | frozenset(
            f for r in files.values() for f in r.get("forecast", []))
        with self._audit_lock:
            cached = self._audits.get((run_id, suite))
            if cached is not None and cached[0] == key:
                return cached[1]
            audit = run_suite(self.root, suite, run_id, threads=2)
            out = [{"name": r.name, "columns": r.columns, "rows": [[_jsonable(v) for v in row] for row in r.rows]}
                   for r in audit.results]
            self._audits[(run_id, suite)] = (key, out)
            return out

    # ------------------------------------------------------------------------------ compare, ladder, SQL
    def configs(self, run_ids: list[str]) -> dict[str, dict]:
        """Each run's config as declared by its first attempt, flattened to dotted keys."""
        with self.scoped(run_ids) as cur:
            found = rows_of(cur.execute("select run_id, arg_min(config, ts) as config from runs "
                                        "where list_contains($runs, run_id) group by run_id", {"runs": run_ids}))
        out = {r["run_id"]: flatten(json.loads(r["config"] or "{}")) for r in found}
        return {r: out.get(r, {}) for r in run_ids}

    def ladders(self) -> list[dict]:
        return self.rows(load("ladders"))

    def rungs(self, ladder: str) -> list[dict]:
        return self.rows(load("rungs"), {"ladder": ladder})

    def ladder_forecasts(self, ladder: str) -> list[dict]:
        """The target runs' forecast vs actual (queries/forecast/vs_actual.sql) and the fitted law of the latest forecast."""
        targets = self.rows(load("ladder_targets"), {"l": ladder})
        target_ids = [t["t"] for t in targets]
        fits = self.rows("select target_run, fraction, fit, rungs, e_fixed, method, revision, time from forecasts "
                         "where list_contains($t, target_run) qualify row_number() over (partition by target_run "
                         "order by ts desc, seq desc) = 1", {"t": target_ids})
        for f in fits:
            f["fit"] = json.loads(f["fit"] or "{}")
            f["rungs"] = json.loads(f["rungs"] or "[]")
        actual = self.rows(f"select * from ({queries.load_query('forecast/vs_actual')}) where list_contains($t, run_id)",
                           {"t": target_ids})
        return [{"target": t, "fit": next((f for f in fits if f["target_run"] == t), None),
                 "points": [a for a in actual if a["run_id"] == t]} for t in target_ids]

    def sql(self, text: str, timeout_s: float = queries.TIMEOUT_S) -> dict:
        """A read-only query from the console: `runledger sql`'s own path (queries.query: its guard, its
        time and memory bounds, the views the query names over the current snapshot), at most
        MAX_SQL_ROWS rows and MAX_SQL_BYTES fetched ("truncated" says when there were more)."""
        cols, rows = queries.query(self.root, text, timeout_s, max_rows=MAX_SQL_ROWS, max_bytes=MAX_SQL_BYTES)
        return {"columns": cols, "rows": [[_jsonable(v) if isinstance(v, (int, float, str, bool, type(None)))
                                           or hasattr(v, "isoformat") else str(v) for v in r] for r in rows],
                "total": len(rows), "truncated": rows.truncated,
                "note": f"truncated at {len(rows)} rows (the bound of {rows.why})" if rows.truncated else None}


def _identity(f: Path) -> str:
    """A file's path, size and mtime (a file of the ledger never changes once written: this tells a new one)."""
    try:
        st = f.stat()
    except OSError:
        return str(f)
    return f"{f}:{st.st_size}:{st.st_mtime_ns}"


def _iso(us: int | None) -> str | None:
    """A time in microseconds since the epoch as ISO 8601, UTC."""
    return None if us is None else datetime.fromtimestamp(us / 1e6, timezone.utc).isoformat()


def flatten(d, prefix: str = "") -> dict:
    """A nested config as {dotted.key: value}."""
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = d
    return out


def config_diff(configs: dict[str, dict]) -> list[dict]:
    """The keys whose values differ between the runs (a key some runs lack differs): [{key, values: {run: v}}]."""
    keys = sorted({k for c in configs.values() for k in c})
    out = []
    for k in keys:
        values = {r: c.get(k) for r, c in configs.items()}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1:
            out.append({"key": k, "values": values})
    return out
