"""How far a root's ledger has stored the stream for a run, and waiting until it has stored an event.

A single ledger records its position in `{root}/ledger.position`; a ledger served in K partitions
records one per partition (`{root}/partitions/k{K}-p{P}.position`, the last RUNLEDGER seq of its runs it
has taken). Each is written after a commit of everything below it, before the ack: a run's events up
to its position (the single ledger's, or its partition's) are readable. The agents, the dashboard's
live feed and the tests wait here for what woke them to be stored.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from runledger.ledger.storage.paths import POSITION_FILE
from runledger.ledger.storage.positions import read_position

STATUS_DIR = "partitions"  # in the root: the partitions' positions, status records and layout
POLL_S = 0.01  # how often a wait reads the positions


def partition_of(run_id: str, k: int) -> int:
    """The partition of a run: what nats-server's `partition(k, 1)` computes (FNV-1a, 32 bits, of the token)."""
    h = 0x811C9DC5
    for b in run_id.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h % k


def positions(root: str | Path) -> dict[str, int]:
    """Every position recorded under `root`, by name: "" the single ledger's (positions.write_position),
    "k{K}-p{P}" each partition's (Part.save), of each K a ledger served the root with."""
    root = Path(root)
    out = {"": read_position(root)} if (root / POSITION_FILE).exists() else {}
    for f in (root / STATUS_DIR).glob("k*-p*.position"):
        try:
            out[f.name.removesuffix(".position")] = int(f.read_text())
        except (OSError, ValueError):
            pass
    return out


def stored_upto(recorded: dict[str, int], run_id: str) -> int:
    """How far the stream is stored for `run_id`, from `positions`: every event of the run up to this
    stream seq is readable (the single ledger's position, or that of the run's partition, whichever
    is further: each is written after a commit of everything below it, of its runs)."""
    upto = recorded.get("", 0)
    for name, seq in recorded.items():
        if name:
            k, p = (int(x) for x in name.removeprefix("k").split("-p"))
            if partition_of(run_id, k) == p:
                upto = max(upto, seq)
    return upto


def is_stored(root: str | Path, upto: dict[str, int]) -> bool:
    """Whether the ledger of `root` has stored each run's events up to its stream seq in `upto`."""
    recorded = positions(root)
    return all(stored_upto(recorded, run_id) >= seq for run_id, seq in upto.items())


async def until_stored(root: str | Path, upto: dict[str, int], timeout_s: float) -> bool:
    """Wait until the ledger of `root` (a single ledger, or every partition concerned) has stored
    (committed) each run's events up to its stream seq in `upto`; False if it had not by `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not is_stored(root, upto):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True
