"""The compare view: each run's config with every `config.update` applied (runledger.ui.configs, the `runs`
view's config_final) flattened to dotted keys, the keys whose values differ, and the metrics the runs logged with
the ones the view opens on (`default_metrics`: the first section they share)."""

from __future__ import annotations

import json

from runledger.ui.configs import flatten
from runledger.ui.keys import SOURCES, key_name, numeric_columns
from runledger.ui.series import minmax
from runledger.ui.snapshot import Snapshot, quote


def configs(snapshot: Snapshot, run_ids: list[str]) -> dict[str, dict]:
    """Each run's config with every config.update applied (the runs page's rows: runledger.ui.configs.config_history),
    flattened to dotted keys."""
    rows = snapshot.summaries()
    return {r: flatten(json.loads(rows[r]["config"] or "{}")) if r in rows else {} for r in run_ids}


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
    """The metrics a view opens on: of the names the most runs have (`counts`: name -> runs, in the order the
    names come: typed steps first, then free-form metrics), the section (`section`) with the most names (the
    first of those), its names the most runs have first, at most `limit`."""
    if not counts:
        return []
    top = max(counts.values())
    sections: dict[str, int] = {}
    for n, c in counts.items():
        if c == top:
            sections[section(n)] = sections.get(section(n), 0) + 1
    chosen = max(sections, key=lambda s: sections[s])  # (the first of the largest)
    return sorted((n for n in counts if section(n) == chosen), key=lambda n: -counts[n])[:limit]


def logged(cur, run_ids: list[str]) -> dict[str, dict[str, list[str]]]:
    """{run: {source: [key]}}: the metrics each run has at least one number of, read on `cur` (a cursor scoped
    to the runs) in one grouped pass per source."""
    out: dict[str, dict[str, list[str]]] = {r: {} for r in run_ids}
    for source, (view, _, _) in SOURCES.items():
        cols = numeric_columns(source, cur)
        if not cols:
            continue
        counts = ", ".join(f"count({quote(c)})" for c in cols)
        for run, *found in cur.execute(f"select run_id, {counts} from {view} where list_contains($runs, run_id) group by run_id",
                                       {"runs": run_ids}).fetchall():
            keys = [key_name(source, c) for c, n in zip(cols, found) if n]
            if keys and run in out:
                out[run][source] = keys
    return out


def overlaid(cur, run_ids: list[str], source: str, keys: list[str], px: int) -> dict[str, dict[str, dict]]:
    """{key: {run: {attempt: [[x...], [y...]]}}}: the runs' points of `keys` (of one source, each a key some run
    has: `logged`), downsampled on one x as a run's page does (`runledger.ui.series.minmax`: per pixel bucket
    the lowest and the highest value), in one SQL pass over the runs (`cur`: scoped to them)."""
    view, x, min_width = SOURCES[source]
    known = {key_name(source, c): c for c in numeric_columns(source, cur)}
    cols = [known[k] for k in keys]
    got = minmax(cur, f"select run_id || ':' || attempt as grp, {x} as x, stream_seq, {', '.join(quote(c) for c in cols)} "
                 f"from {view} where list_contains($runs, run_id) and {x} is not null",
                 {"runs": run_ids}, cols, keys, px, None, None, min_width)["keys"]
    out: dict[str, dict[str, dict]] = {k: {r: {} for r in run_ids} for k in keys}
    for k, groups in got.items():
        for grp, points in groups.items():
            run, _, attempt = grp.rpartition(":")
            out[k].setdefault(run, {})[attempt] = [list(points[0]), list(points[1])]
    return out


def compared_metrics(keys: dict[str, dict[str, list[str]]]) -> list[dict]:
    """Every metric the runs logged ({run: {source: [key]}}: `logged`), source by source in their order (step,
    metrics, eval, system): [{source, key, runs}] (`runs`: how many have it)."""
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
