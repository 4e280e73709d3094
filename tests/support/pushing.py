"""pushing: a root logged offline, for the tests of `runledger push` (tests/support: every helper defined once)."""

from __future__ import annotations

from runledger.ledger import settings
from runledger.ledger.ingest import service
from runledger.ledger.storage import store
from support.batches import batch_for


def offline_root(path, stored_runs: list[str], spooled_run: str | None, n: int = 40):
    """A root logged offline: `stored_runs` in its tables, `spooled_run` still in its spool only."""
    ledger = service.Ledger(path)
    msgs = batch_for(stored_runs, n)
    ledger.write(ledger.decode(msgs))
    ledger.note_taken(len(msgs))
    ledger.commit()
    store.forget_tables(path)
    if spooled_run:
        chain = settings.spool_dir(path) / spooled_run / "worker-0" / "0"
        chain.mkdir(parents=True)
        lines = [data for _, data, _ in batch_for([spooled_run], n)]
        (chain / "seg-000000000000.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return path
