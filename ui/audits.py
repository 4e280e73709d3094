"""A run's audit panels (health checklist, provenance, forecast tables): runledger.queries.audit's suites,
computed again only when the files they read changed, and kept in memory and in the user's cache folder
(runledger.ui.cache) by those files, so that a restart of the dashboard reads none of a big run's rows again.

While a live run writes new files, the page is answered at once with the answer of the files read last time
(marked stale, with when it was worked out) and the audit of the new files runs in the background, one at
a time per run and suite: a 10M-step run's audit takes seconds, and the panel keeps up with the charts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from pathlib import Path

from runledger import queries
from runledger.ui import cache
from runledger.ui.runs import PARTS_VERSION
from runledger.ui.snapshot import Snapshot, jsonable

log = logging.getLogger(__name__)


def suite_version(suite: str) -> str:
    """The suite's SQL and the views it reads, hashed: an answer of other queries is never read back."""
    from runledger.queries.audit import query_names

    parts = [queries.load_query(n).encode() for n in query_names(suite)] + [(queries.HERE / "views.sql").read_bytes()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:12]


CLOSE_WAIT_S = 30.0  # close(): how long an audit under way is waited for


class Audits:
    """The audits of one ledger root's runs, kept by the files they read."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self._audits: dict[tuple[str, str], dict] = {}  # (run, suite) -> {"files": [identity...], "results", "computed_at"}
        self._audit_lock = threading.Lock()  # one audit at a time (a page of runs asks for several)
        self._state_lock = threading.Lock()
        self._running: set[tuple[str, str]] = set()  # audits under way in the background
        self._versions: dict[str, str] = {}
        self._shared = threading.Lock()  # held while the snapshot's connection is used here (`close` waits for it)
        self.closed = False

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """No more use of the snapshot's connection from here (a background audit stops before its next one),
        and no audit left running: one under way is waited for, up to `wait_s` (a daemon thread still inside
        DuckDB when the interpreter exits aborts the process: "terminate called ... exception not rethrown")."""
        with self._shared:
            self.closed = True
        if self._audit_lock.acquire(timeout=wait_s):
            self._audit_lock.release()
        else:
            log.warning("an audit still runs after %.0fs; the dashboard stops anyway", wait_s)

    def files_of(self, run_id: str) -> list[str]:
        """The identities (path, size, mtime) of the files the run's audit reads: its own, its ladder peers'
        and fork parents' where the checks compare with them, and every forecast."""
        files = self.snapshot.run_files()
        scope = getattr(self.snapshot, "health_scope", None)
        if scope is not None:
            with self._shared:
                if self.closed:
                    raise RuntimeError("the dashboard is closing")
                read = [f for fs in scope([run_id], files).values() for f in fs]
        else:
            read = [f for fs in files.get(run_id, {}).values() for f in fs] + [
                f for r in files.values() for f in r.get("forecast", [])]
        return sorted(map(cache.identity, dict.fromkeys(read)))

    def cache_file(self, run_id: str, suite: str) -> Path:
        if suite not in self._versions:
            self._versions[suite] = suite_version(suite)
        name = hashlib.sha256(run_id.encode()).hexdigest()[:24]
        return cache.path(self.snapshot.root, f"audit-{suite}-{self._versions[suite]}", PARTS_VERSION, suffix="") / f"{name}.json"

    def kept(self, run_id: str, suite: str) -> dict | None:
        """The last answer worked out for the run (in memory, or kept on disk by an earlier start), whatever its files."""
        with self._state_lock:
            got = self._audits.get((run_id, suite))
        if got is not None:
            return got
        try:
            got = json.loads(self.cache_file(run_id, suite).read_text())
        except (OSError, ValueError):
            return None
        if not (isinstance(got, dict) and got.get("run_id") == run_id and isinstance(got.get("files"), list)
                and isinstance(got.get("results"), list)):
            return None
        with self._state_lock:
            self._audits.setdefault((run_id, suite), got)
        return got

    def compute(self, run_id: str, suite: str, files: list[str]) -> dict:
        from runledger.queries.audit import run_suite

        with self._audit_lock:
            got = self.kept(run_id, suite)
            if got is not None and got["files"] == files:  # worked out meanwhile
                return got
            if self.closed:
                raise RuntimeError("the dashboard is closing")
            t0 = time.perf_counter()
            audit = run_suite(self.snapshot.root, suite, run_id, threads=2)
            out = [{"name": r.name, "columns": r.columns, "rows": [[jsonable(v) for v in row] for row in r.rows]}
                   for r in audit.results]
            got = {"run_id": run_id, "files": files, "results": out, "computed_at": time.time(),
                   "seconds": round(time.perf_counter() - t0, 3)}
            with self._state_lock:
                self._audits[(run_id, suite)] = got
            cache.write(self.cache_file(run_id, suite), got, default=jsonable)
            log.debug("audit %s of %s in %.3fs", suite, run_id, time.perf_counter() - t0)
            return got

    def _refresh(self, run_id: str, suite: str, files: list[str]) -> None:
        try:
            self.compute(run_id, suite, files)
        except Exception as err:  # (a background audit: its failure shows on the next ask, which runs it again)
            if self.closed:
                return
            log.warning("the %s audit of %s failed: %s", suite, run_id, str(err).splitlines()[0] if str(err) else err)
        finally:
            with self._state_lock:
                self._running.discard((run_id, suite))

    def answer(self, run_id: str, suite: str) -> dict:
        """The run's audit as the page shows it: {"results", "stale", "computed_at", "seconds"}. Fresh when its
        files are the ones read last time (in memory or on disk); else, when an earlier answer is kept, that
        answer marked stale while the audit of the new files runs in the background; else worked out now."""
        files = self.files_of(run_id)
        got = self.kept(run_id, suite)
        if got is None:
            got = self.compute(run_id, suite, files)
        elif got["files"] != files:
            with self._state_lock:
                start = (run_id, suite) not in self._running
                self._running.add((run_id, suite))
            if start:
                threading.Thread(target=self._refresh, args=(run_id, suite, files), daemon=True,
                                 name=f"audit-{suite}").start()
            return {"results": got["results"], "stale": True, "computed_at": got.get("computed_at"),
                    "seconds": got.get("seconds")}
        return {"results": got["results"], "stale": False, "computed_at": got.get("computed_at"), "seconds": got.get("seconds")}

    def warm(self, run_ids: list[str], suites: tuple[str, ...] = ("health", "provenance")) -> None:
        """Work out the panels of these runs in a background thread, where their files changed since they were
        kept (a start after a restart finds them on disk and reads nothing)."""
        def run() -> None:
            for run_id in run_ids:
                try:
                    files = self.files_of(run_id)
                except Exception as err:  # (a run removed meanwhile, say)
                    log.debug("no audit of %s: %s", run_id, err)
                    continue
                for suite in suites:
                    if self.closed:  # (the dashboard stopped: no audit started after)
                        return
                    got = self.kept(run_id, suite)
                    if got is None or got["files"] != files:
                        with self._state_lock:
                            if (run_id, suite) in self._running:
                                continue
                            self._running.add((run_id, suite))
                        self._refresh(run_id, suite, files)

        if run_ids:
            threading.Thread(target=run, daemon=True, name="audit-warm").start()

    def audit(self, run_id: str, suite: str) -> list[dict]:
        """The run's health checklist (or provenance / forecast tables) of its files as they are now."""
        files = self.files_of(run_id)
        got = self.kept(run_id, suite)
        if got is None or got["files"] != files:
            got = self.compute(run_id, suite, files)
        return got["results"]
