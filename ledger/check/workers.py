"""The processes that check rows for `runledger.ledger.check.verify`, forked from a server that has imported
`runledger.ledger.check.rowcheck` once (a process of its own, so no thread of the caller is forked) rather than each
importing it anew.

Light on purpose (multiprocessing only): `runledger verify` starts the server before it imports the
checks itself, so the two imports run side by side (`start_early`).
"""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing import forkserver
from pathlib import Path

# events bytes from which a verify will check rows in processes: about verify.PARALLEL_MIN_ROWS rows
# (~170 bytes a stored event in the bench's ledger), less, so that a root on the edge starts it early
EARLY_MIN_BYTES = 16 << 20


def context() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["runledger.ledger.check.rowcheck"])
    return ctx


def start_early(root: str | Path, jobs: int | None = None) -> None:
    """Start the server now if a verify of `root` will use it (a guess from its events files' bytes)."""
    if (jobs or len(os.sched_getaffinity(0))) > 1 and _events_bytes(Path(root) / "events") >= EARLY_MIN_BYTES:
        context()
        forkserver.ensure_running()


def _events_bytes(folder: Path) -> int:
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            if name.endswith(".parquet"):
                try:
                    total += os.stat(os.path.join(parent, name)).st_size
                except OSError:
                    pass
            if total >= EARLY_MIN_BYTES:
                return total
    return total
