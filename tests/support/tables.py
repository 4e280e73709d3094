"""tables: shared by the tests (tests/support: every helper defined once)."""

from __future__ import annotations

from pathlib import Path

from runledger.ledger.storage import store
from support.runs import Producer, canonical, step_payload


def write_batches(root: Path, n: int, producer: Producer | None = None, first: int = 0) -> Producer:
    p = producer or Producer()
    for b in range(first, first + n):
        store.write_events(root, [canonical(p.event("step", step_payload(float(s)), s, s + 1))
                                  for s in range(b * BATCH, (b + 1) * BATCH)])
    return p


BATCH = 7  # events per commit in these tests: a snapshot's count is always a multiple of it


def steps_all_counts(con) -> tuple[int, int]:
    return con.execute("select count(*), count(distinct event_id) from steps_all").fetchone()


def iceberg_table(root: Path):
    """The step table through pyiceberg's own catalog: what a lab's tools use, no runledger code."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("runledger", uri=f"sqlite:///{root.resolve()}/catalog.db", warehouse=f"file://{root.resolve()}")
    return catalog.load_table("runledger.step")
