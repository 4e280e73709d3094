"""What a run's page shows first: its attempts, chart keys (and the x axis `define_metric` gave each), the kinds
of events it has, its decision trail, its open alerts (and who acknowledged each), forecast band, and the parent
it forked from."""

from __future__ import annotations

import fnmatch
import json

from runledger.ui.keys import keys
from runledger.ui.snapshot import Snapshot, load, rows_of


def run_info(snapshot: Snapshot, run_id: str) -> dict:
    """The run's attempts, chart keys, decision trail and forecast band, read on one cursor scoped to it."""
    with snapshot.scoped([run_id]) as cur:
        found = keys(snapshot, run_id, cur)
        return {"run_id": run_id, "attempts": rows_of(cur.execute(load("run_attempts"), {"run": run_id})),
                "keys": found, "decisions": decisions(snapshot, run_id, cur),
                "alerts": rows_of(cur.execute(load("open_alerts"), {"run": run_id})),
                "step_metrics": step_metrics(cur, run_id, found.get("metrics", [])),
                "kinds": sorted(snapshot.run_files().get(run_id, {})),  # (the page draws an MoE panel where drops came)
                "forecast": rows_of(cur.execute(load("forecast_band"), {"run": run_id})), "position": snapshot.position,
                "fork": fork_of(cur, run_id)}


def fork_of(cur, run_id: str) -> dict | None:
    """The run's parent where it is a fork (its first fork start, views.sql's `forks`): {"parent", "step",
    "attempt"}, so that the page draws the parent's charts beside the fork's, the fork point marked; else None."""
    row = cur.execute("select parent_run, fork_step, parent_attempt from forks where run_id = $run and how = 'fork' "
                      "order by attempt limit 1", {"run": run_id}).fetchone()
    return None if row is None else {"parent": row[0], "step": row[1], "attempt": row[2]}


def step_metrics(cur, run_id: str, names: list[str]) -> dict[str, str]:
    """metric name -> the metric its chart is drawn against: the `step_metric` that `define_metric` (W&B's)
    set for it, by its name or a pattern ("val/*"), as the run's config holds it (runledger.wandb_compat
    keeps it under `_wandb.define_metric`, sent by config.update: the latest setting wins). Only a step metric
    the run logged, never the name itself."""
    defined: dict[str, dict] = {}
    for (text,) in cur.execute("select config from (select config, 0 as o, attempt, ts, seq from runs where run_id = $run "
                               "union all select config, 1, attempt, ts, seq from config_updates where run_id = $run) "
                               "order by o, ts, attempt, seq", {"run": run_id}).fetchall():
        try:
            spec = (json.loads(text or "{}").get("_wandb") or {}).get("define_metric") or {}
        except (ValueError, AttributeError):
            continue
        if isinstance(spec, dict):
            defined.update({str(k): v for k, v in spec.items() if isinstance(v, dict)})
    logged, out = set(names), {}
    for name in names:
        spec = defined.get(name) or next((v for p, v in defined.items() if ("*" in p or "?" in p)
                                          and fnmatch.fnmatchcase(name, p)), None)
        axis = (spec or {}).get("step_metric")
        if isinstance(axis, str) and axis in logged and axis != name:
            out[name] = axis
    return out


def decisions(snapshot: Snapshot, run_id: str, cur=None) -> list[dict]:
    """The run's decision trail, its JSON fields parsed (read on `cur`, scoped to the run, or on one opened here)."""
    if cur is None:
        with snapshot.scoped([run_id]) as cur:
            return decisions(snapshot, run_id, cur)
    out = rows_of(cur.execute(load("decisions"), {"run": run_id}))
    for d in out:
        for k in ("params", "evidence", "before", "after"):
            if isinstance(d.get(k), str):
                try:
                    d[k] = json.loads(d[k])
                except ValueError:
                    pass
    return out
