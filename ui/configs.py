"""A run's config as it stands: its starts' config with every `config.update` applied, in time order (the rule of
the `runs` view's config_final), the keys set or changed during the run, and the run's labels (display name,
W&B group and job type; an imported run's from its source). The runs page's rows (ui/runs.py) are made with
these, and the compare view and the run page's config panel read them there.
"""

from __future__ import annotations

import json

IMPORT_KEY = "_import"  # where an importer keeps the source's own labels in run_started.config (interop.importers.source)


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
