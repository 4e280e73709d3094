"""What a run's page shows of the values it logged beside numbers (`runledger.values`): each histogram as a heat
map over steps, a table at a step with its rows searchable, and its images; a blob served only where one of
the run's `media` events names it, and only if its bytes are still its digest's. And its console
(`runledger.console`): the last lines, or those holding a text.

A heat map's rows are HEAT_ROWS equal bands between the lowest and highest edge the key ever had; each bucket's
count goes to the band its middle falls in (the stored buckets are exact: SQL `histogram_buckets` has them). Read
from the kind views alone (`histograms`, `logged_tables`, `media`), which a run page's cursor scopes to the run.
At most HEAT_STEPS steps are drawn, evenly picked from the run's, the last always among them.
"""

from __future__ import annotations

import hashlib
import json
import math

from runledger.ledger.storage.media import read_blob
from runledger.ui.snapshot import Snapshot, rows_of

HEAT_ROWS = 48
HEAT_STEPS = 240  # columns of a heat map (a chart's width in px, about)
HEAT_KEYS = 12  # histograms one page draws (the others are listed)
TABLE_ROWS = 500  # rows one table request answers (a search narrows them)
MEDIA_SHOWN = 60  # images the page lists (the newest steps first)
CONSOLE_SHOWN = 1000  # console lines one request answers (the last ones, of those a search finds)
INLINE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")  # served as images; any other type as a download


def values_info(snapshot: Snapshot, run_id: str) -> dict:
    """The run's histograms (each key's heat map), tables (key, steps, last step) and newest media."""
    with snapshot.scoped([run_id]) as cur:
        hist_keys = [k for (k,) in cur.execute("select distinct key from histograms where run_id = $run order by key",
                                               {"run": run_id}).fetchall()]
        tables = rows_of(cur.execute("select key, count(*) as steps, max(step) as last_step from logged_tables "
                                     "where run_id = $run group by key order by key", {"run": run_id}))
        media = rows_of(cur.execute("select step, key, sha256, bytes, type, name, caption, width, height from media "
                                    "where run_id = $run order by step desc, key limit $n", {"run": run_id, "n": MEDIA_SHOWN}))
        return {"histograms": [heat_map(cur, run_id, k) for k in hist_keys[:HEAT_KEYS]], "histogram_keys": hist_keys,
                "tables": tables, "media": media}


def heat_map(cur, run_id: str, key: str) -> dict:
    """{"key", "steps", "lo", "hi", "rows", "cells"}: cells[i][j] the count of step steps[i] in band j (from lo)."""
    steps = [s for (s,) in cur.execute("select distinct step from histograms where run_id = $run and key = $key "
                                       "and step is not null order by step", {"run": run_id, "key": key}).fetchall()]
    if len(steps) > HEAT_STEPS:
        stride = (len(steps) - 1) / (HEAT_STEPS - 1)
        steps = sorted({steps[round(i * stride)] for i in range(HEAT_STEPS)})
    stored = cur.execute("select step, edges, counts from histograms where run_id = $run and key = $key and "
                         "list_contains($steps, step) order by attempt, seq", {"run": run_id, "key": key, "steps": steps}).fetchall()
    latest = {step: (json.loads(edges), json.loads(counts)) for step, edges, counts in stored}  # (a later attempt's wins)
    buckets = [(step, e[i], e[i + 1], c[i]) for step, (e, c) in latest.items() for i in range(len(c))]
    if not buckets:
        return {"key": key, "steps": [], "lo": None, "hi": None, "rows": HEAT_ROWS, "cells": []}
    lo, hi = min(b[1] for b in buckets), max(b[2] for b in buckets)
    span = (hi - lo) or 1.0
    column = {s: i for i, s in enumerate(steps)}
    cells = [[0.0] * HEAT_ROWS for _ in steps]
    for step, b_lo, b_hi, count in buckets:
        band = min(HEAT_ROWS - 1, max(0, math.floor(((b_lo + b_hi) / 2 - lo) / span * HEAT_ROWS)))
        cells[column[step]][band] += count
    return {"key": key, "steps": steps, "lo": lo, "hi": hi, "rows": HEAT_ROWS, "cells": cells}


def logged_table(snapshot: Snapshot, run_id: str, key: str, step: int | None = None, search: str = "") -> dict:
    """A table the run logged under `key`, at `step` (default: the last it was logged at): its columns, the steps it
    was logged at, and its rows (the first TABLE_ROWS of those whose text holds `search`, case aside)."""
    with snapshot.scoped([run_id]) as cur:
        steps = [s for (s,) in cur.execute("select distinct step from logged_tables where run_id = $run and key = $key "
                                           "order by step", {"run": run_id, "key": key}).fetchall()]
        if step is None:
            step = steps[-1] if steps else None
        head = cur.execute("select columns, rows, rows_logged from logged_tables where run_id = $run and key = $key and "
                           "step is not distinct from $step order by attempt desc, seq desc limit 1",
                           {"run": run_id, "key": key, "step": step}).fetchone()
    columns, rows, logged = (json.loads(head[0]), json.loads(head[1]), head[2]) if head else ([], [], 0)
    needle = search.casefold()
    found = [[i, cells] for i, cells in enumerate(rows)
             if not needle or needle in "\t".join("" if c is None else str(c) for c in cells).casefold()]
    return {"key": key, "steps": steps, "step": step, "columns": columns, "rows_logged": logged, "rows": found[:TABLE_ROWS]}


def console_lines(snapshot: Snapshot, run_id: str, search: str = "") -> dict:
    """The run's last CONSOLE_SHOWN console lines (those holding `search`, case aside), oldest first, each
    {attempt, stream, line_no, step, text}; and how many lines were left out by the rate bound."""
    with snapshot.scoped([run_id]) as cur:
        stored = cur.execute("select attempt, stream, first, step, lines, dropped from console where run_id = $run "
                             "order by attempt, ts, seq", {"run": run_id}).fetchall()
    needle, out, dropped = search.casefold(), [], 0
    for attempt, stream, first, step, lines, left in stored:
        dropped += left or 0
        for i, text in enumerate(json.loads(lines)):
            if not needle or needle in text.casefold():
                out.append({"attempt": attempt, "stream": stream, "line_no": first + i, "step": step, "text": text})
    return {"lines": out[-CONSOLE_SHOWN:], "found": len(out), "dropped": dropped}


class BlobRefused(LookupError):
    """A blob the page may not serve (not named by the run) or no longer can (gone, or changed: verify names it)."""


def blob(snapshot: Snapshot, run_id: str, digest: str) -> tuple[bytes, str]:
    """The bytes of a blob one of the run's media events names, and the type it is served as; BlobRefused if
    none names it, or its bytes are not its digest's."""
    with snapshot.scoped([run_id]) as cur:
        row = cur.execute("select type from media where run_id = $run and sha256 = $d limit 1",
                          {"run": run_id, "d": digest}).fetchone()
    if row is None:
        raise BlobRefused(f"run {run_id} names no blob {digest[:80]!r}")
    try:
        data = read_blob(snapshot.root, digest)  # (under the root, or in its bucket)
    except FileNotFoundError:
        raise BlobRefused(f"the blob {digest} is missing (runledger verify names it)") from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise BlobRefused(f"the blob {digest} has changed (runledger verify names it)")
    return data, row[0] if row[0] in INLINE_TYPES else "application/octet-stream"
