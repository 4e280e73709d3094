"""The runs page's health column: each run's health checklist's counts {ok, warn, fail, skip}, worked out in
one pass of the health suite over many runs at once, and kept by the files they were counted from (in
memory and in the user's cache folder: runledger.ui.cache).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from pathlib import Path

from runledger import queries
from runledger.queries.columns import kind_columns, kinds
from runledger.ui import cache
from runledger.ui.runs import PARTS_VERSION, RunsIndex
from runledger.ui.snapshot import Snapshot

log = logging.getLogger(__name__)


class HealthCounts:
    """The health counts of one ledger root's runs (their ladder peers and fork parents from `index`)."""

    def __init__(self, snapshot: Snapshot, index: RunsIndex):
        self.snapshot, self.index = snapshot, index
        self._health: dict[str, tuple[frozenset, dict]] = {}  # run -> (its files and the forecasts, its counts)
        self._health_lock = threading.Lock()
        self._health_loaded = False

    def cache_path(self) -> Path:
        """Where the counts are kept between starts (named by the checks' SQL: counts of other checks are not read)."""
        checks = hashlib.sha256(b"".join(p.read_bytes() for p in sorted((queries.HERE / "health").glob("*.sql")))
                                + (queries.HERE / "views.sql").read_bytes()).hexdigest()[:12]
        return cache.path(self.snapshot.root, f"health-{checks}", PARTS_VERSION)

    def health(self, run_ids: list[str]) -> dict[str, dict]:
        """run_id -> its health checklist's counts {ok, warn, fail, skip} (the runs page's column), for
        every run asked: the runs not counted yet (or whose files, or the forecasts, changed since) in
        one pass of the health suite over all of them at once (queries/health/*.sql over the files of
        those runs and of what their checks compare with: `scope`), not one audit per run."""
        from runledger.queries.audit import STATUSES, query_names, shadow

        files = self.snapshot.run_files()
        forecasts = frozenset(f for r in files.values() for f in r.get("forecast", []))
        keys = {r: frozenset(f for fs in files.get(r, {}).values() for f in fs) | forecasts for r in dict.fromkeys(run_ids)}
        with self._health_lock:
            if not self._health_loaded:  # the counts an earlier start kept, by the same files
                self._health_loaded = True
                try:
                    for r, (k, c) in json.loads(self.cache_path().read_text()).items():
                        self._health[r] = (frozenset(k), c)
                except (OSError, ValueError, TypeError):
                    pass
            keys = {r: frozenset(map(cache.identity, k)) for r, k in keys.items()}
            todo = [r for r, k in keys.items() if r in files and self._health.get(r, (None,))[0] != k]
            if todo:
                t0 = time.perf_counter()
                counts = {r: dict.fromkeys(STATUSES, 0) for r in todo}
                own = queries.open_connection(self.snapshot.threads)
                try:
                    con = queries.connect(self.snapshot.root, files=self.scope(todo, files), con=own,
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
                cache.write(self.cache_path(), {r: [sorted(k), c] for r, (k, c) in self._health.items()})
            return {r: self._health[r][1] for r in keys if r in self._health}

    def scope(self, run_ids: list[str], files: dict[str, dict[str, list[Path]]]) -> dict[str, list[Path]]:
        """kind -> the files the health checks of `run_ids` read (runledger.queries.audit.scope_files for many runs at
        once): the runs' own, their ladder peers' run_started and drops, their fork parents' run_started and
        checkpoints, and every forecast (the peers found from the runs page's rows and the forecasts' rungs)."""
        from runledger.queries.audit import PARENT_KINDS, PEER_KINDS

        rows = self.index.summaries()
        ladders = {rows[r]["ladder"] for r in run_ids if r in rows and rows[r]["ladder"] is not None}
        peers = {r for r, row in rows.items() if row["ladder"] in ladders}
        parents = {p for r in run_ids if r in rows for p in rows[r]["parents"]}
        forecasts = [f for r in files.values() for f in r.get("forecast", [])]
        if forecasts:
            with self.snapshot.cursor() as cur:
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
