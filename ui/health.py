"""The runs page's health column: each run's health checklist's counts {ok, warn, fail, skip}, worked out in
one pass of the health suite over many runs at once, and kept by the files they were counted from (in
memory and in the user's cache folder: runledger.ui.cache). Only the checks that apply to a run count, and
a run's page lists only those: a check applies when the run logged its inputs (`CHECK_INPUTS`, read by
check_inputs.sql), so a numpy loop's page does not list MoE drops, forecasts or a schedule it never had.
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
from runledger.ui.snapshot import Snapshot, load

log = logging.getLogger(__name__)

# each health check (its "check" column) -> the inputs it reads, all needed for it to apply (the columns of
# check_inputs.sql: what the run logged); a check not named here applies to every run
CHECK_INPUTS = {
    "config_match": ("run_started",),
    "drop_fraction": ("drops",),
    "drops_vs_ladder": ("drops",),
    "eval_decreasing": ("evals",),
    "forecast_hit": ("forecast",),
    "grad_norm_max": ("grad_norm",),
    "grad_norm_rise": ("grad_norm",),
    "loss_decreasing": ("loss",),
    "loss_floor": ("loss",),
    "lr_schedule": ("schedule", "lr"),
    "mfu_below_plan": ("plan", "throughput"),
    "mfu_constant": ("throughput",),
    "param_norm_growth": ("param_norm",),
    "router_entropy": ("router_entropy",),
    "skipped_steps": ("steps",),
    "telemetry_silence": ("telemetry",),
    # issue 43's
    "loss_spike": ("loss",),
    "router_bias": ("router_bias",),
    "nonfinite_loss": ("steps",),
    "throughput_floor": ("throughput",),
    "still_initializing": ("run_started",),
    "telemetry_gone": ("run_started",),
    "run_down": ("run_started",),
    "resume_matches": ("run_started", "steps"),
    "checkpoints_advancing": ("steps",),
    "attempt_started": ("run_started",),
    "compute_thresholds": ("steps",),
}
# what each input is, in the words the page uses for an input a run did not log
INPUT_WORDS = {
    "run_started": "run_started", "drops": "token drops", "evals": "evals (eval/loss, val/loss)",
    "forecast": "a forecast", "grad_norm": "grad_norm", "loss": "a loss (loss, train/loss)", "lr": "a learning rate",
    "schedule": "an LR schedule (peak_lr)", "plan": "a throughput plan", "throughput": "MFU or tokens/s",
    "param_norm": "param_norm", "router_entropy": "router_entropy", "steps": "steps", "telemetry": "telemetry",
    "router_bias": "router_bias_min / router_bias_max",
}


def check_inputs(cur, run_ids: list[str]) -> dict[str, frozenset]:
    """run_id -> the inputs of the health checks it logged (check_inputs.sql, on a connection whose views
    hold those runs' files)."""
    rel = cur.execute(load("check_inputs"), {"runs": list(run_ids)})
    cols = [d[0] for d in rel.description][1:]
    return {row[0]: frozenset(c for c, v in zip(cols, row[1:]) if v) for row in rel.fetchall()}


def missing(check: str, have: frozenset) -> list[str]:
    """The inputs of `check` the run did not log (none: the check applies)."""
    return [i for i in CHECK_INPUTS.get(check, ()) if i not in have]


def applicable(results: list[dict], have: frozenset) -> tuple[list[dict], list[dict]]:
    """A run's health audit (runledger.ui.audits: results of {name, columns, rows}) cut to the checks that
    apply to it, and the checks left out, each {check, missing: [input words]}."""
    kept, left = [], {}
    for r in results:
        at = r["columns"].index("check") if "check" in r["columns"] else None
        rows = []
        for row in r["rows"]:
            lacks = missing(row[at], have) if at is not None else []
            if lacks:
                left.setdefault(row[at], [INPUT_WORDS.get(i, i) for i in lacks])
            else:
                rows.append(row)
        if rows:
            kept.append({**r, "rows": rows})
    return kept, [{"check": c, "missing": m} for c, m in left.items()]


class HealthCounts:
    """The health counts of one ledger root's runs (their ladder peers and fork parents from `index`)."""

    def __init__(self, snapshot: Snapshot, index: RunsIndex):
        self.snapshot, self.index = snapshot, index
        self._health: dict[str, tuple[frozenset, dict]] = {}  # run -> (its files and the forecasts, its counts)
        self._health_lock = threading.Lock()
        self._health_loaded = False
        self._inputs: dict[str, tuple[frozenset, frozenset]] = {}  # run -> (its files and the forecasts, its inputs)

    def cache_path(self) -> Path:
        """Where the counts are kept between starts (named by the checks' SQL: counts of other checks are not read)."""
        checks = hashlib.sha256(b"".join(p.read_bytes() for p in sorted((queries.HERE / "health").glob("*.sql")))
                                + (queries.HERE / "views.sql").read_bytes() + load("check_inputs").encode()
                                + json.dumps(CHECK_INPUTS, sort_keys=True).encode()).hexdigest()[:12]
        return cache.path(self.snapshot.root, f"health-{checks}", PARTS_VERSION)

    def health(self, run_ids: list[str]) -> dict[str, dict]:
        """run_id -> its health checklist's counts {ok, warn, fail, skip} (the runs page's column: of the
        checks that apply to it only), for every run asked: the runs not counted yet (or whose files, or the
        forecasts, changed since) in one pass of the health suite over all of them at once (queries/health/*.sql
        over the files of those runs and of what their checks compare with: `scope`), not one audit per run."""
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
                    have = check_inputs(con, todo)
                    for name in query_names("health"):
                        for run, check, status in con.execute(
                                f"select run_id, \"check\", status from ({queries.load_query(name)})").fetchall():
                            if run in counts and status in counts[run] and not missing(check, have.get(run, frozenset())):
                                counts[run][status] += 1
                finally:
                    own.close()
                for r in todo:
                    self._health[r] = (keys[r], counts[r])
                    self._inputs[r] = (keys[r], have.get(r, frozenset()))
                log.debug("health of %d runs in %.3fs", len(todo), time.perf_counter() - t0)
                cache.write(self.cache_path(), {r: [sorted(k), c] for r, (k, c) in self._health.items()})
            return {r: self._health[r][1] for r in keys if r in self._health}

    def inputs(self, run_id: str) -> frozenset:
        """The inputs of the health checks the run logged (check_inputs.sql), kept by the files they were read from."""
        files = self.snapshot.run_files()
        key = frozenset(map(cache.identity, frozenset(f for fs in files.get(run_id, {}).values() for f in fs)
                            | frozenset(f for r in files.values() for f in r.get("forecast", []))))
        kept = self._inputs.get(run_id)
        if kept is not None and kept[0] == key:
            return kept[1]
        with self.snapshot.scoped([run_id], files=files) as cur:
            have = check_inputs(cur, [run_id]).get(run_id, frozenset())
        self._inputs[run_id] = (key, have)
        return have

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
