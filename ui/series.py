"""A run's chart points, downsampled in SQL by min/max per pixel bucket (every spike stays), and the answers
kept by the files they were read from (in memory and in the user's cache folder: runledger.ui.cache), so
that a finished run's page, opened again or after a restart, does not read its millions of rows again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
from pathlib import Path

from runledger import queries
from runledger.queries.columns import kind_columns
from runledger.ui import cache
from runledger.ui.keys import SOURCE_KINDS, SOURCES, columns_of, stored_columns
from runledger.ui.runs import PARTS_VERSION
from runledger.ui.snapshot import Snapshot, jsonable, load, quote

log = logging.getLogger(__name__)
SERIES_KEPT = 64  # answers of `series` kept (each at most a few pixels' worth of points per key)
PARTS_KEPT = 20_000  # one file's buckets (or its x range) kept in memory, for the full range of a growing run


class Series:
    """The answers of `series` over one ledger root, kept by their files."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self._series: dict[tuple, dict] = {}  # answers of `series`, by their files (oldest first)
        self._parts: dict[tuple, object] = {}  # (file identity, ...) -> its x range, or its buckets at one width
        self._parts_lock = threading.Lock()

    def series(self, run_id: str, source: str, keys: list[str], px: int = 600,
               x0: float | None = None, x1: float | None = None, xaxis: str = "step") -> dict:
        """The points of `keys` of one source, per attempt, downsampled in SQL: per pixel bucket of x and
        attempt, the smallest and the largest value, each at its own x (so every spike stays, up or
        down); a bucket holding one point gives that point, so a zoomed range with fewer points than
        pixels is exact. Never sampled.
        `xaxis` (`x_axis`): what the points are drawn against, the step (a system sample: its time) by default.
        Returns {"keys": {key: {attempt: [[x...], [y...]]}}, "x": [lo, hi], "rows": n, "seq": max stream_seq}."""
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r} (one of {', '.join(SOURCES)})")
        view = SOURCES[source][0]
        files = self.snapshot.run_files()
        key = (run_id, source, tuple(keys), int(px), x0, x1, frozenset(files.get(run_id, {}).get(SOURCE_KINDS[source], [])),
               xaxis)
        if key in self._series:  # the same points of the same files: a finished run's page opened again
            return self._series[key]
        # ... or by an earlier start of the dashboard: the answer is kept in the cache folder by its files' paths
        # (a file never changes once written), so a restart does not read a big run's millions of rows again
        kept = self.cache_dir() / (hashlib.sha256(json.dumps(
            [*key[:6], sorted(map(cache.identity, key[6])), PARTS_VERSION, *([xaxis] if xaxis != "step" else [])]
        ).encode()).hexdigest()[:32] + ".json")
        try:
            out = json.loads(kept.read_text())
        except (OSError, ValueError):
            out = None
        if not (isinstance(out, dict) and isinstance(out.get("keys"), dict) and set(out["keys"]) == set(keys)):
            with self.snapshot.scoped([run_id], files=files) as cur:
                exprs = columns_of(source, keys, cur, run_id)
                stored = stored_columns(source, keys, cur)
                if x0 is None and x1 is None and xaxis == "step" and stored is not None:
                    # the full range against the step: from each file's buckets (a new file: only its own read)
                    out = self.full_range(cur, run_id, source, stored, keys, px, sorted(key[6]))
                else:
                    cols = [f"v{i}" for i in range(len(exprs))]  # (a name past the bound on columns: an expression)
                    x, params, min_width = x_axis(cur, run_id, source, xaxis)
                    rows = view
                    if xaxis.startswith("metric:"):  # the step metric's value logged at the same step (by any call)
                        rows = f"(select *, max({x}) over (partition by attempt, step) as rl_x from {view} where run_id = $run)"
                        x = "rl_x"
                    out = minmax(cur, f"select attempt as grp, {x} as x, stream_seq, "
                                 f"{', '.join(f'{e} as {c}' for e, c in zip(exprs, cols))} "
                                 f"from {rows} where run_id = $run and {x} is not null",
                                 {"run": run_id, **params}, cols, keys, px, x0, x1, min_width)
            self._keep(kept, out)
        while len(self._series) >= SERIES_KEPT:
            self._series.pop(next(iter(self._series)))
        self._series[key] = out
        return out

    def full_range(self, cur, run_id: str, source: str, cols: list[str], keys: list[str], px: int, files: list[Path]) -> dict:
        """`series` over the run's whole x range, worked out per file and kept by file: the buckets are
        floor(x / width) with `width` the power of two at or above the range's width per pixel (so that
        they stay the same while the run grows, until its range doubles), each file's lowest and highest
        value per bucket and attempt, each at its x, merged over the files. A live run's new file costs its
        own read, not the run's millions of rows again. (At most `px` + 1 buckets; every spike stays.)"""
        _, x, min_width = SOURCES[source]
        kind = SOURCE_KINDS[source]
        px = max(8, min(int(px), 4000))
        out: dict[str, dict] = {k: {} for k in keys}
        ranges = [self._part(cur, ("range", f, run_id, x), lambda f=f: cur.execute(
            f"select min({x}), max({x}), max(stream_seq), count(*) from {queries.scan_files([f], kind_columns(kind))} "
            f"where run_id = $run and {x} is not null", {"run": run_id}).fetchone()) for f in files]
        ranges = [r for r in ranges if r[0] is not None]
        if not ranges:
            return {"keys": out, "x": [None, None], "seq": max([r[2] or 0 for r in ranges], default=0), "rows": 0}
        lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
        width = 2.0 ** math.ceil(math.log2(max((hi - lo) / px, min_width)))
        merged: dict[tuple, list] = {}
        for f in files:
            for grp, bucket, *vals in self._part(cur, ("buckets", f, run_id, x, tuple(cols), width),
                                                  lambda f=f: self._buckets(cur, f, kind, run_id, x, cols, width)):
                have = merged.get((grp, bucket))
                if have is None:
                    merged[(grp, bucket)] = list(vals)
                    continue
                for i in range(len(cols)):  # the lower of the lows, the higher of the highs, each at its x
                    xlo, vlo, xhi, vhi = vals[4 * i:4 * i + 4]
                    if vlo is not None and (have[4 * i + 1] is None or vlo < have[4 * i + 1]):
                        have[4 * i:4 * i + 2] = [xlo, vlo]
                    if vhi is not None and (have[4 * i + 3] is None or vhi > have[4 * i + 3]):
                        have[4 * i + 2:4 * i + 4] = [xhi, vhi]
        for (grp, _), vals in sorted(merged.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            for i, k in enumerate(keys):
                v = vals[4 * i:4 * i + 4]
                pts = sorted({(px_, y) for px_, y in zip(v[0::2], v[1::2]) if y is not None})
                if not pts:
                    continue
                xs, ys = out[k].setdefault(str(grp), ([], []))
                for px_, y in pts:
                    xs.append(px_)
                    ys.append(y)
        return {"keys": out, "x": [lo, hi], "seq": max(r[2] or 0 for r in ranges), "rows": sum(r[3] for r in ranges)}

    def _part(self, cur, key: tuple, work):
        """One file's part (its x range, or its buckets at one width), kept by the file's identity."""
        key = (cache.identity(key[1]), *key[2:], key[0])
        with self._parts_lock:
            if key in self._parts:
                return self._parts[key]
        got = work()
        with self._parts_lock:
            if len(self._parts) >= PARTS_KEPT:
                self._parts.clear()
            self._parts[key] = got
        return got

    @staticmethod
    def _buckets(cur, f: Path, kind: str, run_id: str, x: str, cols: list[str], width: float) -> list[tuple]:
        import pyarrow.parquet as pq

        from runledger.ledger.storage.objects import source

        have = set(pq.read_schema(source(f)).names)  # (a name first logged after this file was written: null here)
        picked = ", ".join(f"{quote(c)}::double as {quote(c)}" if c in have else f"null::double as {quote(c)}" for c in cols)
        aggs = []
        for c in map(quote, cols):
            aggs += [f"arg_min(x, {c})", f"min({c})", f"arg_max(x, {c})", f"max({c})"]
        return cur.execute(f"select grp, floor(x / $w)::bigint as bucket, {', '.join(aggs)} from (select attempt as grp, {x} as x, "
                           f"{picked} from {queries.scan_files([f], kind_columns(kind))} where run_id = $run and {x} is not null) "
                           "group by all", {"run": run_id, "w": width}).fetchall()

    def cache_dir(self) -> Path:
        """Where the answers are kept between starts (one file each)."""
        return cache.path(self.snapshot.root, "series", PARTS_VERSION, suffix="")

    @staticmethod
    def _keep(path: Path, out: dict) -> None:
        """Keep one answer of `series` in the cache folder (the SERIES_KEPT newest; written whole or not at all)."""
        if not cache.write(path, out, default=jsonable):
            return
        try:
            kept = sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
            for old in kept[:-SERIES_KEPT]:
                old.unlink(missing_ok=True)
        except OSError as err:
            log.debug("a series answer is not kept (%s)", err)


def layer_drops(snapshot: Snapshot, run_id: str, px: int = 600, x0: float | None = None, x1: float | None = None,
                xaxis: str = "step") -> dict:
    """Drop fraction per layer and attempt (group "ATTEMPT:LAYER"; layer -1: the run's total where no layers were sent)."""
    with snapshot.scoped([run_id]) as cur:
        x, params, min_width = x_axis(cur, run_id, "drops", xaxis)
        return minmax(cur, f"select attempt || ':' || layer as grp, {x} as x, stream_seq, drop_fraction "
                      f"from ({load('layer_drops')}) where {x} is not null",
                      {"run": run_id, **params}, ["drop_fraction"], ["drop_fraction"], px, x0, x1, min_width)


X_AXES = ("step", "tokens", "time", "rel")  # and "metric:NAME" (a metric's step_metric)


def x_axis(cur, run_id: str, source: str, xaxis: str) -> tuple[str, dict, float]:
    """What a source's points are drawn against (an SQL expression over its rows, its parameters, the smallest
    bucket width): "step" (a system sample, which has no step: its time); "tokens", the step times the run's
    tokens_per_step (a system sample: its time); "time", seconds since the epoch; "rel", seconds since the
    run's first start; "metric:NAME", the value of the metric NAME logged at the same step (define_metric's
    step_metric: the metrics source only). Refuses any other (a ValueError: nothing else reaches the SQL)."""
    step, ts = "step", ("t" if source == "drops" else "epoch(ts)")
    if xaxis in ("step", "tokens") and source == "system":
        return ts, {}, 1e-6
    if xaxis == "step":
        return step, {}, 1.0
    if xaxis == "time":
        return ts, {}, 1e-6
    if xaxis == "rel":
        t0 = cur.execute("select epoch(min(ts)) from runs where run_id = ?", [run_id]).fetchone()[0]
        if t0 is None:
            t0 = cur.execute("select epoch(min(ts)) from events where run_id = ?", [run_id]).fetchone()[0]
        return f"({ts} - $t0)", {"t0": t0 or 0.0}, 1e-6
    if xaxis == "tokens":
        tps = cur.execute("select max(tokens_per_step) from runs where run_id = ?", [run_id]).fetchone()[0]
        if not tps:
            raise ValueError("the run has no tokens_per_step (run_started) to draw against tokens")
        return f"({step} * $tps)", {"tps": int(tps)}, float(tps)
    if xaxis.startswith("metric:") and source == "metrics":
        return columns_of("metrics", [xaxis.removeprefix("metric:")], cur, run_id)[0], {}, 1e-9
    raise ValueError(f"unknown x axis {xaxis[:60]!r} (one of {', '.join(X_AXES)}, or metric:NAME for the metrics source)")


def minmax(cur, relation: str, params: dict, cols: list[str], keys: list[str], px: int,
           x0: float | None, x1: float | None, min_width: float) -> dict:
    """The points of `cols` (named `keys`) of `relation` (grp, x, stream_seq, cols...), per group: per pixel
    bucket of x, the lowest and the highest value, each at its x (see `Series.series`)."""
    px = max(8, min(int(px), 4000))
    lo, hi, seq, n = cur.execute(f"select min(x), max(x), max(stream_seq), count(*) from ({relation})",
                                 params).fetchone()
    lo, hi = (lo if x0 is None else x0), (hi if x1 is None else x1)
    out: dict[str, dict] = {k: {} for k in keys}
    if lo is None or hi is None:
        return {"keys": out, "x": [lo, hi], "seq": seq or 0, "rows": n or 0}
    width = max((hi - lo) / px, min_width)
    aggs = []
    for c in map(quote, cols):  # per bucket: the lowest and the highest value, each at its x
        aggs += [f"arg_min(x, {c})", f"min({c})", f"arg_max(x, {c})", f"max({c})"]
    res = cur.execute(f"select grp, floor((x - $lo) / $w)::bigint as bucket, {', '.join(aggs)} from ({relation}) "
                      "where x between $lo and $hi group by all order by grp, bucket",
                      {**params, "lo": lo, "hi": hi, "w": width}).fetchall()
    for row in res:
        grp, vals = str(row[0]), row[2:]
        for i, k in enumerate(keys):
            v = vals[4 * i:4 * i + 4]
            pts = sorted({(x, y) for x, y in zip(v[0::2], v[1::2]) if y is not None})
            if not pts:
                continue
            xs, ys = out[k].setdefault(grp, ([], []))
            for x, y in pts:  # (two values at one x, e.g. a step logged twice: both extremes kept)
                xs.append(x)
                ys.append(y)
    return {"keys": out, "x": [lo, hi], "seq": seq or 0, "rows": n or 0}
