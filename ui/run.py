"""What a run's page shows first: its attempts, chart keys, decision trail and forecast band."""

from __future__ import annotations

import json

from runledger.ui.keys import keys
from runledger.ui.snapshot import Snapshot, load, rows_of


def run_info(snapshot: Snapshot, run_id: str) -> dict:
    """The run's attempts, chart keys, decision trail and forecast band, read on one cursor scoped to it."""
    with snapshot.scoped([run_id]) as cur:
        return {"run_id": run_id, "attempts": rows_of(cur.execute(load("run_attempts"), {"run": run_id})),
                "keys": keys(snapshot, run_id, cur), "decisions": decisions(snapshot, run_id, cur),
                "forecast": rows_of(cur.execute(load("forecast_band"), {"run": run_id})), "position": snapshot.position}


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
