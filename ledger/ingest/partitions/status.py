"""A partition's status record (`{root}/partitions/k{K}-p{P}.json`, written only by its writer): the
writer, since when, its last commit and snapshot, the backlog as of its last fetch, its commits' waits,
and each takeover with the time the partition was without a writer. `runledger status` and the UI read it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from runledger.ledger.ingest.partitions.leases import Leases
from runledger.ledger.ingest.partitions.parts import Part

log = logging.getLogger(__name__)

STATUS_EVERY_S = 1.0  # how often a writer rewrites its partition's status record
TAKEOVERS_KEPT = 20  # takeovers remembered in a status record


async def report_status(root: Path, part: Part, leases: Leases, ledger, ended: asyncio.Event) -> None:
    """Rewrite the partition's status record from its writer's `ledger` every STATUS_EVERY_S, and once
    more when `ended`."""
    while True:
        commit = {"last_commit": ledger.last_commit} if ledger.last_commit else {}  # (else the predecessor's)
        waits = sorted(ledger.counters.ack_waits)  # this writer's commits: first batch in to its ack
        if waits:
            commit["ack_wait_ms"] = {"median": round(waits[len(waits) // 2] * 1e3, 1),
                                     "p99": round(waits[int(len(waits) * 0.99)] * 1e3, 1), "commits": len(waits)}
            own = sorted(ledger.counters.commit_s)
            commit["commit_ms"] = {"median": round(own[len(own) // 2] * 1e3, 1),
                                   "p99": round(own[int(len(own) * 0.99)] * 1e3, 1)}
        part.update_status(root, writer=leases.instance, renewed=time.time(), position=ledger.taken_upto,
                           backlog=ledger.backlog, stored=ledger.counters.stored, **commit)
        if ended.is_set():  # (the last figures written once the writer stopped)
            return
        try:
            await asyncio.wait_for(ended.wait(), STATUS_EVERY_S)
        except asyncio.TimeoutError:
            pass


def record_takeover(root: Path, part: Part, leases: Leases) -> None:
    """The partition has a writer again: record who took it from whom, and how long it was without one
    (from the previous holder's last renewal that this instance saw, to now)."""
    now = time.time()
    prev = leases.previous(part.p)
    doc = part.read_status(root)
    takeovers = doc.get("takeovers", [])
    if prev.get("renewed"):
        gap = round(now - prev["renewed"], 3)
        takeovers = (takeovers + [{"from": prev.get("holder"), "to": leases.instance, "at": now, "gap_s": gap}])[-TAKEOVERS_KEPT:]
        log.info("partition %d: taken over from %s after %.2f s without a writer", part.p, prev.get("holder"), gap)
    part.update_status(root, writer=leases.instance, since=now, renewed=now, takeovers=takeovers)
