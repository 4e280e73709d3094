"""The ladder view: the ladders, a ladder's rungs, and its target runs' forecast vs actual."""

from __future__ import annotations

import json

from runledger import queries
from runledger.ui.snapshot import Snapshot, load


def ladders(snapshot: Snapshot) -> list[dict]:
    return snapshot.rows(load("ladders"))


def rungs(snapshot: Snapshot, ladder: str) -> list[dict]:
    return snapshot.rows(load("rungs"), {"ladder": ladder})


def ladder_forecasts(snapshot: Snapshot, ladder: str) -> list[dict]:
    """The target runs' forecast vs actual (queries/forecast/vs_actual.sql) and the fitted law of the latest forecast."""
    targets = snapshot.rows(load("ladder_targets"), {"l": ladder})
    target_ids = [t["t"] for t in targets]
    fits = snapshot.rows("select target_run, fraction, fit, rungs, e_fixed, method, revision, time from forecasts "
                         "where list_contains($t, target_run) qualify row_number() over (partition by target_run "
                         "order by ts desc, seq desc) = 1", {"t": target_ids})
    for f in fits:
        f["fit"] = json.loads(f["fit"] or "{}")
        f["rungs"] = json.loads(f["rungs"] or "[]")
    actual = snapshot.rows(f"select * from ({queries.load_query('forecast/vs_actual')}) where list_contains($t, run_id)",
                           {"t": target_ids})
    return [{"target": t, "fit": next((f for f in fits if f["target_run"] == t), None),
             "points": [a for a in actual if a["run_id"] == t]} for t in target_ids]
