"""What the dashboard reads: `Reader`, one ledger root's snapshot (runledger.ui.snapshot: its positions, one
long-lived read-only DuckDB connection, cursors scoped to the runs a read is about) with each page's reads,
by concept: the runs page (ui/runs.py) and its health column (ui/health.py), a run's page (ui/run.py), its
logged histograms, tables, images and console (ui/values.py), its chart keys (ui/keys.py), points (ui/series.py), live points (ui/points.py) and audit panels (ui/audits.py),
the compare view (ui/compare.py) and a run's config as applied (ui/configs.py), the ladder view (ui/ladders.py) and the SQL console (ui/console.py).

What does not change is kept, by the files it was read from, in memory and in the user's cache folder
(runledger.ui.cache), so that a restart, or a new file, costs only the new files: the runs page's parts of
each file, the health counts, and the answers of `series` (a big run's min/max pass).
"""

from __future__ import annotations

import json
from pathlib import Path

from runledger import queries
from runledger.ui import compare, console, health, keys, ladders, points, run, series, values
from runledger.ui.audits import Audits
from runledger.ui.health import HealthCounts
from runledger.ui.runs import FIRST_PAGE, RunsIndex
from runledger.ui.snapshot import Snapshot

PRIME_AUDITS = 3  # the newest runs whose audit panels a start works out in the background (the runs one opens first)


class Reader(Snapshot):
    """The dashboard's view of one ledger root: its snapshot's reads, and each page's."""

    def __init__(self, root: str | Path, threads: int | None = None):
        super().__init__(root, threads)
        self.index = RunsIndex(self)  # the runs page's rows, kept by file
        self.counts = HealthCounts(self, self.index)  # their health counts, kept by file
        self.charts = series.Series(self)  # a run's chart points, kept by file
        self.audits = Audits(self)  # a run's audit panels, kept by file

    def close(self) -> None:
        self.audits.close()  # (its background audits stop using the connection first)
        super().close()

    def run_id(self, run: str) -> str:
        """The id of the run `run` names: its id, or a name one run has (`runledger.queries.names.resolve_run`,
        the rule every command that takes a RUN follows); AmbiguousRun (a ValueError, listing the runs)
        where several have it."""
        from runledger.queries.names import resolve_run

        files = self.run_files()
        if run in files:
            return run
        with self.scoped(None, files=files) as cur:
            return resolve_run(self.root, run, con=cur)

    # ------------------------------------------------------------------------------ runs page
    def summaries(self) -> dict[str, dict]:
        return self.index.summaries()

    def file_parts(self, files: dict[str, dict[str, list[Path]]]) -> dict[str, list[dict]]:
        return self.index.file_parts(files)

    def runs(self, name: str = "", tag: str = "", status: str = "", config: str = "", limit: int = 5000,
             metrics: list[str] | None = None, files: dict[str, dict[str, list[Path]]] | None = None) -> list[dict]:
        return self.index.runs(name, tag, status, config, limit, metrics, files)

    def metric_counts(self, files: dict[str, dict[str, list[Path]]] | None = None) -> dict[str, int]:
        return self.index.metric_counts(files)

    def run_config(self, run_id: str) -> dict:
        """The run's config with every config.update applied, and each key set or changed after its start
        (at which step, before and after): `runledger.ui.configs.config_history`."""
        row = self.summaries().get(run_id)
        return {"run_id": run_id, "config": json.loads(row["config"]) if row else {},
                "changes": row["config_changes"] if row else []}

    def prime(self, rows: int = FIRST_PAGE) -> None:
        """Work out the runs page's rows and its metric columns' last values, then the health counts of the
        newest `rows` runs (its first page), and start the audit panels of the newest few runs in the background
        (ui/audits.py: kept on disk)."""
        self.metric_counts()
        newest = [r["run_id"] for r in self.runs(limit=rows)]
        self.health(newest)
        self.audits.warm(newest[:PRIME_AUDITS])

    def health(self, run_ids: list[str]) -> dict[str, dict]:
        return self.counts.health(run_ids)

    def health_scope(self, run_ids: list[str], files: dict[str, dict[str, list[Path]]]) -> dict[str, list[Path]]:
        return self.counts.scope(run_ids, files)

    # ------------------------------------------------------------------------------ one run
    def run_info(self, run_id: str) -> dict:
        return run.run_info(self, run_id)

    def values(self, run_id: str) -> dict:
        return values.values_info(self, run_id)

    def logged_table(self, run_id: str, key: str, step: int | None = None, search: str = "") -> dict:
        return values.logged_table(self, run_id, key, step, search)

    def console(self, run_id: str, search: str = "") -> dict:
        return values.console_lines(self, run_id, search)

    def blob(self, run_id: str, digest: str) -> tuple[bytes, str]:
        return values.blob(self, run_id, digest)

    def decisions(self, run_id: str, cur=None) -> list[dict]:
        return run.decisions(self, run_id, cur)

    def keys(self, run_id: str, cur=None) -> dict[str, list[str]]:
        return keys.keys(self, run_id, cur)

    def series(self, run_id: str, source: str, keys: list[str], px: int = 600,
               x0: float | None = None, x1: float | None = None, xaxis: str = "step") -> dict:
        return self.charts.series(run_id, source, keys, px, x0, x1, xaxis)

    def layer_drops(self, run_id: str, px: int = 600, x0: float | None = None, x1: float | None = None,
                    xaxis: str = "step") -> dict:
        return series.layer_drops(self, run_id, px, x0, x1, xaxis)

    def new_points(self, run_id: str, since: int, upto: int | None = None) -> dict:
        return points.new_points(self, run_id, since, upto)

    def audit(self, run_id: str, suite: str) -> list[dict]:
        """The run's audit panel; the health checklist cut to the checks that apply to the run (`health.applicable`)."""
        out = self.audits.audit(run_id, suite)
        return health.applicable(out, self.counts.inputs(run_id))[0] if suite == "health" else out

    def audit_answer(self, run_id: str, suite: str) -> dict:
        """The run's audit panel as the page shows it (`Audits.answer`: fresh, or the last answer marked stale
        while the new files are audited); the health checklist cut to the checks that apply, and the others
        with the inputs the run did not log (`not_applicable`)."""
        out = self.audits.answer(run_id, suite)
        if suite == "health":
            shown, left = health.applicable(out["results"], self.counts.inputs(run_id))
            out = {**out, "results": shown, "not_applicable": left}
        return out

    # ------------------------------------------------------------------------------ compare, ladder, SQL
    def configs(self, run_ids: list[str]) -> dict[str, dict]:
        return compare.configs(self, run_ids)

    def ladders(self) -> list[dict]:
        return ladders.ladders(self)

    def rungs(self, ladder: str) -> list[dict]:
        return ladders.rungs(self, ladder)

    def ladder_forecasts(self, ladder: str) -> list[dict]:
        return ladders.ladder_forecasts(self, ladder)

    def sql(self, text: str, timeout_s: float = queries.TIMEOUT_S) -> dict:
        return console.sql(self.root, text, timeout_s)
