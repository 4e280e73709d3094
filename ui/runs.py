"""The runs page's rows (ui/runs.sql's), put together from what each event file holds of each run.

What the runs page needs of each event file, by kind (`FILE_PARTS`): one grouped query over every file
not yet seen (projected to these columns), one row per file and run. A file never changes once written
(compaction writes new ones), so each answer is kept by the file's path, size and mtime, in memory and in
the user's cache folder (runledger.ui.cache): a restart, or a new file, costs only the files not seen yet.
The rows of ui/runs.sql are then put together from the files' parts (`merge`): the same answer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from runledger import queries
from runledger.ledger.contract.roles import is_person
from runledger.ui import cache
from runledger.queries.columns import envelope_columns, kind_columns
from runledger.ui.configs import config_history, flatten, labels
from runledger.ui.keys import key_name
from runledger.ui.snapshot import Snapshot, quote, rows_of

log = logging.getLogger(__name__)

FILE_PARTS = {
    "run_started": "select filename, run_id, epoch_us(min(ts)) as first_us, epoch_us(max(ts)) as last_us, "
                   "arg_min(project, ts) as project, arg_min(tags, ts) as tags, "
                   "arg_min(preset, ts) as preset, arg_min(ladder ->> 'name', ts) as ladder, "
                   "list(distinct parent ->> 'run_id') filter (parent is not null) as parents, "
                   "list(distinct attempt) as attempts, "
                   # each start's config and labels, in the order `configs` applies them
                   "list([epoch_us(ts)::varchar, '0', attempt::varchar, seq::varchar, step::varchar, config, name, "
                   "\"group\", job_type]) as sets",
    "config": "select filename, run_id, "
              "list([epoch_us(ts)::varchar, '1', attempt::varchar, seq::varchar, step::varchar, config]) as sets",
    "step": "select filename, run_id, max(step) as last_step, epoch_us(max(ts)) as last_us, count(*) as steps",
    "metrics": "select filename, run_id, max(step) as last_step, epoch_us(max(ts)) as last_us, count(*) as steps",
    "run_finished": "select filename, run_id, arg_max(status, ts) as status, epoch_us(max(ts)) as last_us",
    "alert": "select filename, run_id, list([alert_id, producer, stream_seq::varchar, seq::varchar, state, severity]) as alerts",
}
PARTS_VERSION = hashlib.sha256(json.dumps(FILE_PARTS, sort_keys=True).encode()).hexdigest()[:12]
LAST_KINDS = ("step", "metrics")  # the kinds whose metrics' last values the runs page can show as columns
LAST_COLUMNS = 200  # columns aggregated by one query of `last_parts` (a file of many metrics: several queries)
FIRST_PAGE = 100  # rows of the runs page drawn at a time (app.js PAGE_ROWS): their health counts are worked out at start
SILENT_S = 600.0  # Marin: telemetry silent > 10 min (queries/thresholds.py silence_max_s's default)
_MISSING = object()


def unseen(files: dict[str, dict[str, list[Path]]], kinds, kept: dict[str, list]) -> tuple[dict, dict, dict]:
    """The files of `kinds` split by what `kept` (str(path) -> [size:mtime, ..., what was read]) holds for them:
    ({path: what was read} for those kept at their present size and mtime, {kind: [paths to read]}, {path to
    read: its size:mtime}). A file gone since the listing (a compaction's: the next listing has its successor)
    is in neither."""
    out: dict[str, object] = {}
    todo: dict[str, list[str]] = {}
    idents: dict[str, str] = {}
    for kind in kinds:
        for run in files.values():
            for f in run.get(kind, []):
                p = str(f)
                try:
                    st = f.stat()
                except OSError:
                    continue
                ident = f"{st.st_size}:{st.st_mtime_ns}"
                have = kept.get(p)
                if have is not None and have[0] == ident:
                    out[p] = have[-1]
                else:
                    todo.setdefault(kind, []).append(p)
                    idents[p] = ident
    return out, todo, idents


class RunsIndex:
    """The runs page's rows of one ledger root, kept by the files they were summarised from."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self._summary: dict[str, dict] = {}  # the runs page's rows, by run
        self._summary_sig: dict[str, frozenset] = {}  # the files each row was summarised from
        self._summary_lock = threading.Lock()
        self.parts: dict[str, list] = {}  # str(path) -> [its size:mtime, kind, its parts] (`file_parts`)
        self.lasts: dict[str, list] = {}  # str(path) -> [its size:mtime, {run: {metric: [step, time, value]}}] (`last_parts`)
        self._last_run: dict[str, tuple] = {}  # run -> (its files, {metric: [step, time, value]})
        self._load_parts()

    def cache_path(self) -> Path:
        """Where the files' parts are kept between starts."""
        return cache.path(self.snapshot.root, "files", PARTS_VERSION)

    def _load_parts(self) -> None:
        for kept, path, size in ((self.parts, self.cache_path(), 3), (self.lasts, self.lasts_path(), 2)):
            try:
                found = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(found, dict):
                kept.update({p: v for p, v in found.items() if isinstance(v, list) and len(v) == size})

    def lasts_path(self) -> Path:
        """Where the files' last metric values are kept between starts."""
        return cache.path(self.snapshot.root, "lasts", PARTS_VERSION)

    def file_parts(self, files: dict[str, dict[str, list[Path]]]) -> dict[str, list[dict]]:
        """str(path) -> that file's parts (rows of FILE_PARTS, one per run in it), for the files of the
        kinds the runs page reads; read only for the files not seen before (one query per kind)."""
        out, todo, idents = unseen(files, FILE_PARTS, self.parts)
        for kind, paths_ in todo.items():
            t0 = time.perf_counter()
            scan = ", ".join(queries.sql_str(p) for p in paths_)
            with self.snapshot.cursor() as cur:
                # the columns by their names across files of one schema (the common case: each footer read
                # once), else unified over files whose columns differ (metrics: each footer read twice)
                for by_name in ("false", "true"):
                    try:
                        got = rows_of(cur.execute(f"{FILE_PARTS[kind]} from read_parquet([{scan}], union_by_name="
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
                self.parts[p] = [idents[p], kind, out[p]]
            log.debug("%s: %d new files read in %.3fs", kind, len(paths_), time.perf_counter() - t0)
        if todo:
            cache.write(self.cache_path(), self.parts)
        return out

    def summaries(self, files: dict[str, dict[str, list[Path]]] | None = None) -> dict[str, dict]:
        """run_id -> its row of the runs page (ui/runs.sql's), put together again only for the runs whose
        files changed, from the parts of each file (`file_parts`: only new files are read; `files`: the
        snapshot's run_files() when the caller has listed them)."""
        with self._summary_lock:
            files = files if files is not None else self.snapshot.run_files()
            signature = {r: frozenset(f for fs in k.values() for f in fs) for r, k in files.items()}
            changed = [r for r, sig in signature.items() if self._summary_sig.get(r) != sig]
            for gone in set(self._summary) - set(signature):
                self._summary.pop(gone, None)
                self._summary_sig.pop(gone, None)
            listed = {str(f) for sig in signature.values() for f in sig}
            for gone in [p for p in self.parts if p not in listed and not os.path.exists(p)]:
                self.parts.pop(gone)  # (files a compaction replaced, once the ledger removed them)
            if changed:
                t0 = time.perf_counter()
                parts = self.file_parts({r: files[r] for r in changed})
                for r in changed:
                    by_kind = {kind: [row for f in files[r].get(kind, []) for row in parts.get(str(f), [])
                                      if row["run_id"] == r] for kind in FILE_PARTS}
                    row = merge(by_kind)
                    if row is None:
                        self._summary.pop(r, None)
                    else:
                        self._summary[r] = row
                    self._summary_sig[r] = signature[r]
                log.debug("runs summarised again: %d in %.3fs", len(changed), time.perf_counter() - t0)
            return self._summary

    def last_parts(self, files: dict[str, dict[str, list[Path]]]) -> dict[str, dict]:
        """str(path) -> {run: {metric: [step, time (us), value]}}: each metric's last value in that file (at
        its greatest step, then time; nulls skipped), for the files of LAST_KINDS; read only for the files not
        seen before: one grouped query per kind (and per LAST_COLUMNS of its columns), kept like `file_parts`."""
        out, todo, idents = unseen(files, LAST_KINDS, self.lasts)
        envelope = set(envelope_columns())
        for kind, paths_ in todo.items():
            t0 = time.perf_counter()
            scan = ", ".join(queries.sql_str(p) for p in paths_)
            found: dict[str, dict] = {p: {} for p in paths_}
            with self.snapshot.cursor() as cur:
                # the columns the files have (a file written before a column was added lacks it): the typed
                # numbers of the contract (step), or a column per metric name, each file its own (metrics)
                names = [n for (n,) in cur.execute(f"select name from parquet_schema([{scan}]) "
                                                   "where type in ('DOUBLE', 'FLOAT', 'INT64', 'INT32')").fetchall()]
                if kind == "step":
                    typed = {c for c, t in kind_columns(kind) if t in ("DOUBLE", "BIGINT") and c not in envelope}
                    cols = [c for c, _ in kind_columns(kind) if c in typed and c in set(names)]
                else:
                    cols = list(dict.fromkeys(n for n in names if n.startswith("metrics/") and n != "metrics/"))
                for i in range(0, len(cols), LAST_COLUMNS):
                    chunk = cols[i:i + LAST_COLUMNS]
                    aggs = ", ".join(f"arg_max([step::double, epoch_us(ts)::double, {quote(c)}::double], [step, epoch_us(ts)]) "
                                     f"filter ({quote(c)} is not null)" for c in chunk)
                    got = cur.execute(f"select filename, run_id, {aggs} from read_parquet([{scan}], union_by_name=true, "
                                      "hive_partitioning=false, filename=true) where step is not null group by filename, run_id").fetchall()
                    for row in got:
                        last = found.setdefault(row[0], {}).setdefault(row[1], {})
                        for c, v in zip(chunk, row[2:]):
                            if v is not None and v[2] == v[2]:
                                last[key_name(kind, c)] = [int(v[0]), int(v[1]), v[2]]
            for p in paths_:
                out[p] = found.get(p, {})
                self.lasts[p] = [idents[p], out[p]]
            log.debug("last values of %s: %d new files read in %.3fs", kind, len(paths_), time.perf_counter() - t0)
        if todo:
            for gone in [p for p in self.lasts if p not in idents and p not in out and not os.path.exists(p)]:
                self.lasts.pop(gone)
            cache.write(self.lasts_path(), self.lasts)
        return out

    def last_values(self, files: dict[str, dict[str, list[Path]]] | None = None) -> dict[str, dict]:
        """run -> {metric: [step, time (us), value]}: each metric's last value in the run (its typed steps and
        free-form metrics; at the greatest step, then time), put together again only for the runs whose files
        changed (`files`: as `summaries` takes them)."""
        with self._summary_lock:
            files = files if files is not None else self.snapshot.run_files()
            sigs = {r: frozenset(f for kind in LAST_KINDS for f in k.get(kind, [])) for r, k in files.items()}
            changed = {r: files[r] for r, sig in sigs.items() if self._last_run.get(r, (None,))[0] != sig}
            for gone in set(self._last_run) - set(sigs):
                self._last_run.pop(gone)
            if changed:
                parts = self.last_parts(changed)
                for r, kinds_ in changed.items():
                    merged: dict[str, list] = {}
                    for kind in LAST_KINDS:
                        for f in kinds_.get(kind, []):
                            for name, v in parts.get(str(f), {}).get(r, {}).items():
                                if name not in merged or v[:2] > merged[name][:2]:
                                    merged[name] = v
                    self._last_run[r] = (sigs[r], merged)
            return {r: v[1] for r, v in self._last_run.items()}

    def metric_counts(self, files: dict[str, dict[str, list[Path]]] | None = None) -> dict[str, int]:
        """Every metric name the runs logged (typed steps and free-form metrics) -> how many runs have a value of it."""
        counts: dict[str, int] = {}
        for last in self.last_values(files).values():
            for n in last:
                counts[n] = counts.get(n, 0) + 1
        return counts

    def runs(self, name: str = "", tag: str = "", status: str = "", config: str = "", limit: int = 5000,
             metrics: list[str] | None = None, files: dict[str, dict[str, list[Path]]] | None = None) -> list[dict]:
        """The runs page's rows, newest first, filtered by a part of the name (or id), a tag, a status and a
        config key=value (a dotted key; the value compared as JSON, else as text; the config with every
        config.update applied); with `metrics`, each row's `last` value of each (`last_values`)."""
        key, _, value = config.partition("=")
        key, value = key.strip(), value.strip()
        if key and not re.fullmatch(r"[A-Za-z0-9_.\-]{1,200}", key):
            raise ValueError(f"config filter {config!r}: KEY=VALUE with a dotted key of letters, digits, _ - .")
        now = datetime.now(timezone.utc).timestamp()
        out = []
        for row in self.summaries(files).values():
            last = datetime.fromisoformat(row["last_event"]).timestamp() if row["last_event"] else None
            age = None if last is None else round(now - last, 1)
            state = row["finished"] or ("silent" if age is not None and age > SILENT_S else "running")
            if (name and name.lower() not in row["run_id"].lower() and name.lower() not in (row["name"] or "").lower()) or (tag and tag not in (row["tags"] or [])) \
                    or (status and status != state):
                continue
            if key:
                found = flatten(json.loads(row["config"] or "{}")).get(key, _MISSING)
                if found is _MISSING or (json.dumps(found) != value and str(found) != value):
                    continue
            first = datetime.fromisoformat(row["started_at"]).timestamp() if row["started_at"] else None
            out.append({k: v for k, v in row.items() if k not in ("config", "config_changes", "finished", "parents")}
                       | {"status": state, "age_s": age,
                          "duration_s": None if last is None or first is None else round(last - first, 1)})
        if metrics:
            lasts = self.last_values(files)
            for row in out:
                got = lasts.get(row["run_id"], {})
                row["last"] = {m: got[m][2] if m in got else None for m in metrics}
        out.sort(key=lambda r: (r["started_at"] or "", r["run_id"]), reverse=True)
        return out[:limit]


def merge(by_kind: dict[str, list[dict]]) -> dict | None:
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
    started = [x for s in starts for x in s["sets"]]
    config, changes = config_history(started + [x for c in by_kind.get("config", []) for x in c["sets"]])
    return {
        "run_id": first["run_id"], "project": first["project"], "preset": first["preset"], "ladder": first["ladder"],
        "attempts": len({a for s in starts for a in s["attempts"]}), **labels(started),
        "tags": json.loads(first["tags"]) if first["tags"] else [], "config": json.dumps(config, separators=(",", ":")),
        "config_changes": changes,
        "finished": fin["status"] if fin else None, "last_step": max(steps) if steps else None,
        "steps": sum(s["steps"] for s in stepped), "started_at": _iso(first["first_us"]), "last_event": _iso(last_event),
        "alerts_warn": open_.count("warn"), "alerts_fail": open_.count("fail"),
        "parents": sorted({p for s in starts for p in s["parents"] or [] if p}),
    }


def _iso(us: int | None) -> str | None:
    """A time in microseconds since the epoch as ISO 8601, UTC."""
    return None if us is None else datetime.fromtimestamp(us / 1e6, timezone.utc).isoformat()
