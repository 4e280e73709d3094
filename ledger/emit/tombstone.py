"""Deleting a run the sanctioned way (`runledger delete`): its tombstone published, the ledger's removal
awaited, its spool let go.

The tombstone (`RunDeleted`, kind `tombstone`, producer `cli`: a person's) names each chain the ledger
recorded for the run up to its head (`runledger.ledger.storage.removal.tombstone_for`), who deleted it
(`by`, as `authority` knows them) and when (its envelope's `time`). It is published like any event;
the ledger stores it, then takes the rows it covers out of the tables by a rewrite commit
(`runledger.ledger.storage.removal`), and its retention lets the run's stream messages go once every
durable consumer has acked them (`runledger.ledger.bus.retention`). `delete` waits for both the
tombstone and the removal to show in the tables, then removes the run's spool chains (but one a live
process holds). Who may publish a tombstone is the server's to say: on a secure server only the
`admin` role (`runledger.ledger.bus.natsserver.permissions`).
"""

from __future__ import annotations

import getpass
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from runledger.ledger.emit.chains import next_attempt
from runledger.ledger.emit.emitter import Emitter
from runledger.ledger.storage import locks, removal

PRODUCER = "cli"  # a person's (runledger.ledger.contract.roles.PERSON_PRODUCERS)
POLL_S = 0.2


@dataclass
class Deleted:
    """What `delete_run` did: the tombstone's event_id, the events it covers, the spool chains removed and
    those left because a live process holds them."""

    run_id: str
    tombstone: str
    events: int
    spool_removed: list[str] = field(default_factory=list)
    spool_held: list[str] = field(default_factory=list)


def identity(nats_url: str) -> tuple[str, str]:
    """(by, authority) of the person deleting: the credential's user on a server that names one (a secure
    server's URL carries it), else the OS user (the embedded default)."""
    user = urlparse(nats_url).username
    return (user, "nats_user") if user else (getpass.getuser(), "os_user")


def delete_run(root: str | Path, nats_url: str, run_id: str, reason: str | None = None,
               timeout: float = 60.0) -> Deleted:
    """Publish the tombstone of everything the ledger stored of `run_id`, wait until the ledger stored it and
    took the rows it covers out (TimeoutError if not within `timeout`), then remove the run's spool.
    Raises LookupError if nothing of the run is left to delete."""
    root = Path(root)
    by, authority = identity(nats_url)
    payload = removal.tombstone_for(root, run_id, by, authority, reason)
    spool = root / "spool"
    em = Emitter(run_id, PRODUCER, next_attempt(run_id, PRODUCER, spool, root=root), nats_url, spool)
    em.emit(payload, step=None)
    event_id = f"{run_id}:{em.producer}:{em.attempt}:0"
    if not em.close(timeout=timeout):
        raise TimeoutError(f"the tombstone of run {run_id} is spooled but not acknowledged by {_shown(nats_url)} "
                           f"within {timeout:.0f} s; `runledger sync` sends it")
    deadline = time.monotonic() + timeout
    while not removal.removed(root, event_id):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the ledger has not stored tombstone {event_id} and removed run {run_id}'s rows "
                               f"within {timeout:.0f} s (is its ledger serving {root}?)")
        time.sleep(POLL_S)
    done = Deleted(run_id, event_id, payload.events)
    for chain in sorted(p for p in (spool / run_id).glob("*/*") if p.is_dir()):
        name = ":".join(chain.parts[-3:])
        if locks.is_held(chain / "lock"):
            done.spool_held.append(name)
        else:
            shutil.rmtree(chain, ignore_errors=True)
            done.spool_removed.append(name)
    return done


def _shown(url: str) -> str:
    u = urlparse(url)
    return f"{u.scheme}://{u.hostname}:{u.port}" if u.hostname else url
