"""A live page's new points: every number of a run stored since the page's last read, exact (ui/streams.py
reads them once per wake per run and hands them to every stream of that run)."""

from __future__ import annotations

from runledger.ui.keys import NARROW, SOURCE_KINDS, SOURCES, key_name, numeric_columns
from runledger.ui.snapshot import Snapshot, load, quote

MAX_LIVE_ROWS = 50_000  # events one live push reads; past it the page is told to draw itself again


def new_points(snapshot: Snapshot, run_id: str, since: int, upto: int | None = None) -> dict:
    """Every number of the run stored after stream seq `since` up to the ledger's position, exact:
    {source: {key: {attempt: [[x], [y]]}}}, the drops per layer, and the kinds of the other events
    that came (decisions, alerts ...); "seq": the position, where the next call starts.
    Only up to the position (of the run's partition, on a partitioned root): the ledger writes it
    after committing everything below it, while the tables of one commit become readable one kind
    after another, so a later event of one kind can be readable before an earlier one of another
    (a cursor at the greatest seq read would skip that one). `upto`: stop there, if the position is past it."""
    upto = min(snapshot.position_of(run_id), upto if upto is not None else float("inf"))  # (read before the
    # snapshot's files are listed: they hold all of it)
    out: dict = {"seq": max(since, upto), "kinds": []}
    if upto <= since:
        return out
    with snapshot.scoped([run_id]) as cur:
        counts = dict(cur.execute("select kind, count(*) from events where run_id = ? and stream_seq > ? "
                                  "and stream_seq <= ? group by kind", [run_id, since, upto]).fetchall())
        out["kinds"] = list(counts)
        if sum(counts.values()) > MAX_LIVE_ROWS:  # (a page far behind: it draws itself again, at the pixels' resolution)
            out["reload"] = True
            return out
        for source, (view, x, _) in SOURCES.items():
            if SOURCE_KINDS[source] not in out["kinds"]:
                continue
            cols = numeric_columns(source, cur)
            names = [key_name(source, c) for c in cols]
            narrow = source in ("metrics", "system") and NARROW in {r[0] for r in cur.execute(f"describe {view}").fetchall()}
            picked = [quote(c) for c in cols] + ([quote(NARROW)] if narrow else [])  # (and the names past the bound)
            cur.execute(f"select attempt, {x}, stream_seq, {', '.join(picked)} from {view} "
                        f"where run_id = ? and stream_seq > ? and stream_seq <= ? and {x} is not null order by stream_seq",
                        [run_id, since, upto])
            for row in cur.fetchall():
                values = list(zip(names, row[3:3 + len(cols)])) + (list((row[-1] or {}).items()) if narrow else [])
                for name, v in values:
                    if v is not None:
                        xs, ys = out.setdefault(source, {}).setdefault(name, {}).setdefault(str(row[0]), ([], []))
                        xs.append(row[1])
                        ys.append(v)
        if "drops" not in out["kinds"]:
            return out
        for grp, step, frac, seq in cur.execute(
                f"select attempt || ':' || layer, step, drop_fraction, stream_seq from ({load('layer_drops')}) "
                "where stream_seq > $since and stream_seq <= $upto order by stream_seq",
                {"run": run_id, "since": since, "upto": upto}).fetchall():
            xs, ys = out.setdefault("drops", {}).setdefault(grp, ([], []))
            xs.append(step)
            ys.append(frac)
    return out
