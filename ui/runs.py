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
from runledger.ui.compare import flatten
from runledger.ui.snapshot import Snapshot, rows_of

log = logging.getLogger(__name__)

FILE_PARTS = {
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
PARTS_VERSION = hashlib.sha256(json.dumps(FILE_PARTS, sort_keys=True).encode()).hexdigest()[:12]
FIRST_PAGE = 100  # rows of the runs page drawn at a time (app.js PAGE_ROWS): their health counts are worked out at start
SILENT_S = 600.0  # Marin: telemetry silent > 10 min (queries/thresholds.py silence_max_s's default)
_MISSING = object()


class RunsIndex:
    """The runs page's rows of one ledger root, kept by the files they were summarised from."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self._summary: dict[str, dict] = {}  # the runs page's rows, by run
        self._summary_sig: dict[str, frozenset] = {}  # the files each row was summarised from
        self._summary_lock = threading.Lock()
        self.parts: dict[str, list] = {}  # str(path) -> [its size:mtime, kind, its parts] (`file_parts`)
        self._load_parts()

    def cache_path(self) -> Path:
        """Where the files' parts are kept between starts."""
        return cache.path(self.snapshot.root, "files", PARTS_VERSION)

    def _load_parts(self) -> None:
        try:
            found = json.loads(self.cache_path().read_text())
        except (OSError, ValueError):
            return
        if isinstance(found, dict):
            self.parts.update({p: v for p, v in found.items() if isinstance(v, list) and len(v) == 3})

    def file_parts(self, files: dict[str, dict[str, list[Path]]]) -> dict[str, list[dict]]:
        """str(path) -> that file's parts (rows of FILE_PARTS, one per run in it), for the files of the
        kinds the runs page reads; read only for the files not seen before (one query per kind)."""
        out: dict[str, list[dict]] = {}
        todo: dict[str, list[str]] = {}
        idents: dict[str, str] = {}
        for kind in FILE_PARTS:
            for run in files.values():
                for f in run.get(kind, []):
                    p = str(f)
                    try:
                        st = f.stat()
                    except OSError:  # dropped by a compaction since the listing: the next listing has its successor
                        continue
                    ident = f"{st.st_size}:{st.st_mtime_ns}"
                    kept = self.parts.get(p)
                    if kept is not None and kept[0] == ident:
                        out[p] = kept[2]
                    else:
                        todo.setdefault(kind, []).append(p)
                        idents[p] = ident
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

    def summaries(self) -> dict[str, dict]:
        """run_id -> its row of the runs page (ui/runs.sql's), put together again only for the runs whose
        files changed, from the parts of each file (`file_parts`: only new files are read)."""
        with self._summary_lock:
            files = self.snapshot.run_files()
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
    return {
        "run_id": first["run_id"], "project": first["project"], "preset": first["preset"], "ladder": first["ladder"],
        "attempts": len({a for s in starts for a in s["attempts"]}),
        "tags": json.loads(first["tags"]) if first["tags"] else [], "config": first["config"],
        "finished": fin["status"] if fin else None, "last_step": max(steps) if steps else None,
        "steps": sum(s["steps"] for s in stepped), "started_at": _iso(first["first_us"]), "last_event": _iso(last_event),
        "alerts_warn": open_.count("warn"), "alerts_fail": open_.count("fail"),
        "parents": sorted({p for s in starts for p in s["parents"] or [] if p}),
    }


def _iso(us: int | None) -> str | None:
    """A time in microseconds since the epoch as ISO 8601, UTC."""
    return None if us is None else datetime.fromtimestamp(us / 1e6, timezone.utc).isoformat()
