"""A run's audit panels (health checklist, provenance, forecast tables): runledger.queries.audit's suites,
computed again only when the run's files or the forecasts changed."""

from __future__ import annotations

import threading

from runledger.ui.snapshot import Snapshot, jsonable


class Audits:
    """The audits of one ledger root's runs, kept by the files they read."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self._audits: dict[tuple[str, str], tuple[frozenset, list]] = {}  # (run, suite) -> (its files, rows)
        self._audit_lock = threading.Lock()

    def audit(self, run_id: str, suite: str) -> list[dict]:
        """The run's health checklist (or provenance / forecast tables): computed again only when the
        run's files or the forecasts changed, and one audit at a time (a page of runs asks for several)."""
        from runledger.queries.audit import run_suite

        files = self.snapshot.run_files()
        key = frozenset(f for kind, fs in files.get(run_id, {}).items() for f in fs) | frozenset(
            f for r in files.values() for f in r.get("forecast", []))
        with self._audit_lock:
            cached = self._audits.get((run_id, suite))
            if cached is not None and cached[0] == key:
                return cached[1]
            audit = run_suite(self.snapshot.root, suite, run_id, threads=2)
            out = [{"name": r.name, "columns": r.columns, "rows": [[jsonable(v) for v in row] for row in r.rows]}
                   for r in audit.results]
            self._audits[(run_id, suite)] = (key, out)
            return out
