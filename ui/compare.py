"""The compare view: each run's config with every `config.update` applied (`config_history`, the `runs` view's
config_final) flattened to dotted keys, the keys whose values differ, and the metrics the runs logged with
the ones the view opens on (`default_metrics`: the first section they share)."""

from __future__ import annotations

import json

from runledger.ui.snapshot import Snapshot

IMPORT_KEY = "_import"  # where an importer keeps the source's own labels in run_started.config (interop.importers.source)


def configs(snapshot: Snapshot, run_ids: list[str]) -> dict[str, dict]:
    """Each run's config with every config.update applied (the runs page's rows: `config_history`), flattened to dotted keys."""
    rows = snapshot.summaries()
    return {r: flatten(json.loads(rows[r]["config"] or "{}")) if r in rows else {} for r in run_ids}


def config_history(sets: list[list]) -> tuple[dict, list[dict]]:
    """A run's config with every config.update applied, and each key set or changed after its first start.

    `sets`: its starts' and config events' [ts (us), late ('0' a start, '1' a config event), attempt, seq,
    step, config, ...] (ui/runs.py's parts), applied in time order, a start before an update at the same
    time, each top-level key taking its latest value (the rule of the `runs` view's config_final).
    Changes: [{key, step, attempt, before, after, new}] (`new`: the key was not set before)."""
    config: dict = {}
    changes: list[dict] = []
    first = True
    for s in sorted(sets, key=lambda s: (int(s[0]), s[1], int(s[2]), int(s[3]))):
        try:
            c = json.loads(s[5]) if s[5] else None
        except ValueError:
            c = None
        if not isinstance(c, dict):
            continue
        if not first:
            for k, v in c.items():
                if k not in config or _same(config[k]) != _same(v):
                    changes.append({"key": k, "step": None if s[4] is None else int(s[4]), "attempt": int(s[2]),
                                    "before": config.get(k), "after": v, "new": k not in config})
        config.update(c)
        first = False
    return config, changes


def _same(v) -> str:
    return json.dumps(v, sort_keys=True)


def labels(starts: list[list]) -> dict:
    """A run's display name, W&B group and job type: the earliest start's that has each, else (an imported
    run) the source's own, kept under config._import (the name an MLflow run or a W&B run was shown by)."""
    ordered = sorted(starts, key=lambda s: (int(s[0]), int(s[2]), int(s[3])))
    out = {}
    for i, key in ((6, "name"), (7, "group"), (8, "job_type")):
        out[key] = next((s[i] for s in ordered if len(s) > i and s[i]), None)
    if ordered and not all(out.values()):
        try:
            source = (json.loads(ordered[0][5] or "{}") or {}).get(IMPORT_KEY) or {}
        except (ValueError, AttributeError):
            source = {}
        if isinstance(source, dict):
            for key, names in (("name", ("name", "run_name")), ("group", ("group",)), ("job_type", ("job_type",))):
                found = next((source[n] for n in names if isinstance(source.get(n), str) and source[n]), None)
                out[key] = out[key] or found
    return out


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


def section(name: str) -> str:
    """A metric's section: its name's text before the first '/' ('' for a name without one)."""
    return name.split("/", 1)[0] if "/" in name else ""


def default_metrics(counts: dict[str, int], limit: int) -> list[str]:
    """The metrics a view opens on: the section (`section`) of the first name the most runs have (`counts`: name
    -> runs, in the order the names come: typed steps first, then free-form metrics as logged), its names
    the most runs have first, at most `limit`."""
    if not counts:
        return []
    top = max(counts.values())
    first = next(n for n, c in counts.items() if c == top)
    names = [n for n in counts if section(n) == section(first)]
    return sorted(names, key=lambda n: -counts[n])[:limit]


def compared_metrics(keys: dict[str, dict[str, list[str]]]) -> list[dict]:
    """Every metric the runs logged ({run: {source: [key]}}, `runledger.ui.keys.keys` of each), source by
    source in their order (step, metrics, eval, system): [{source, key, runs}] (`runs`: how many have it)."""
    out: dict[tuple[str, str], int] = {}
    for source in ("step", "metrics", "eval", "system"):
        for found in keys.values():
            for key in found.get(source, []):
                out[source, key] = out.get((source, key), 0) + 1
    return [{"source": s, "key": k, "runs": n} for (s, k), n in out.items()]


def opened_on(metrics: list[dict], limit: int) -> tuple[str, list[str]]:
    """The source and keys compare opens on: the first section the runs share (`default_metrics`), in the
    first source that has it; system samples only where the runs logged nothing else."""
    for sources in (("step", "metrics", "eval"), ("system",)):
        for source in sources:
            best = max((m["runs"] for m in metrics if m["source"] in sources), default=0)
            shared = {m["key"]: m["runs"] for m in metrics if m["source"] == source and m["runs"] == best}
            if shared:
                return source, default_metrics(shared, limit)
    return "step", []
