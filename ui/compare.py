"""The compare view's config table: each run's config flattened to dotted keys, and the keys whose values differ."""

from __future__ import annotations

import json

from runledger.ui.snapshot import Snapshot, rows_of


def configs(snapshot: Snapshot, run_ids: list[str]) -> dict[str, dict]:
    """Each run's config as declared by its first attempt, flattened to dotted keys."""
    with snapshot.scoped(run_ids) as cur:
        found = rows_of(cur.execute("select run_id, arg_min(config, ts) as config from runs "
                                    "where list_contains($runs, run_id) group by run_id", {"runs": run_ids}))
    out = {r["run_id"]: flatten(json.loads(r["config"] or "{}")) for r in found}
    return {r: out.get(r, {}) for r in run_ids}


def flatten(d, prefix: str = "") -> dict:
    """A nested config as {dotted.key: value}."""
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = d
    return out


def config_diff(configs: dict[str, dict]) -> list[dict]:
    """The keys whose values differ between the runs (a key some runs lack differs): [{key, values: {run: v}}]."""
    keys = sorted({k for c in configs.values() for k in c})
    out = []
    for k in keys:
        values = {r: c.get(k) for r, c in configs.items()}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1:
            out.append({"key": k, "values": values})
    return out
