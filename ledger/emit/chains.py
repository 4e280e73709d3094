"""What is known of a producer's chains: the ledger's view of them, and the attempt a (re)started producer takes.

A chain is (run_id, producer, attempt). Its attempts are known from three places: the ledger (asked
over NATS, `ask_ledger`), the Parquet files of a root (read directly), and this machine's spool (chains
not yet stored, perhaps). `next_attempt` is the one rule every producer uses: one past every attempt
known, or, for a producer that continues its own spooled chain (an agent, a person's `decide`), the
newest spooled chain when no newer one is stored, so that what it left unacknowledged is sent.

A new attempt is claimed, not just counted: its spool folder is made with one `mkdir`, which the OS
lets only one process win, and a taken number moves the claim to the next. So two processes starting
one run together (two `runledger.init(id=R, resume=True)`) get two attempts, never one chain between
them. (Across machines, whose spools the claim cannot reach, two starts of one attempt write different
events under one seq: the ledger quarantines the second as a conflict and `verify` names it.)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from nats.errors import NoRespondersError, NoServersError, TimeoutError as NatsTimeout

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.bus.natsserver import LEDGER_API
from runledger.ledger.redact import redact

ASK_TIMEOUT_S = 2.0  # one request to the ledger
ASK_RETRY_S = 0.25  # while waiting for a ledger to answer
CONNECT_S = 2.0  # bus.connect's connect_timeout


async def ask_ledger(nc, run_id: str, producer: str) -> dict | None:
    """The ledger's view of (run_id, producer): {"ack_floor": stream seq, "chains": {attempt: {"stored_upto",
    "conflicts"}}}; None if no ledger answers."""
    try:
        reply = await nc.request(f"{LEDGER_API}.chains.{run_id}.{producer}", b"", timeout=ASK_TIMEOUT_S)
    except (NoRespondersError, NatsTimeout):
        return None
    return json.loads(reply.data)


def ledger_attempts(run_id: str, producer: str, nats_url: str, wait_s: float = 0.0) -> list[int]:
    """The attempts of (run_id, producer) the ledger has stored, asked over NATS, waiting up to `wait_s`
    for a ledger to answer. Raises RuntimeError if none does: the attempt is the ledger's to say, not a guess."""
    async def ask() -> dict | None:
        nc = await bus.connect(nats_url, name=f"attempts-{producer}", max_reconnect_attempts=0)
        try:
            return await ask_ledger(nc, run_id, producer)
        finally:
            await nc.close()

    deadline = time.monotonic() + wait_s
    while True:
        try:  # its own loop, on a daemon thread: the caller may be inside one, and Ctrl-C reaches it
            status = bus.run_aside(ask(), ASK_TIMEOUT_S + CONNECT_S + 1.0)
        except (OSError, TimeoutError, NatsTimeout, NoServersError):  # no server (yet): as no ledger
            status = None
        if status is not None:
            return [int(a) for a in status["chains"]]
        if time.monotonic() > deadline:
            raise RuntimeError(f"cannot learn the next attempt of {run_id}:{producer}: no ledger answers at "
                               f"{redact(nats_url)}; start `runledger ledger serve` or pass attempt=")
        time.sleep(ASK_RETRY_S)


def stored_attempts(root: str | Path, run_id: str, producer: str) -> list[int]:
    """The attempts of (run_id, producer) in a root's Parquet files."""
    from runledger.ledger.storage import reads  # (pyarrow: loaded here, for a root's files, not by `init`)

    t = reads.read_events(Path(root), run_id=run_id, columns=["producer", "attempt"])
    return [a for p, a in zip(t.column("producer").to_pylist(), t.column("attempt").to_pylist()) if p == producer]


def spooled_attempts(spool_dir: str | Path, run_id: str, producer: str) -> list[int]:
    """The attempts of (run_id, producer) with a chain in this machine's spool."""
    d = Path(spool_dir) / run_id / producer
    return [int(p.name) for p in d.glob("*") if p.name.isdigit()] if d.exists() else []


def next_attempt(run_id: str, producer: str, spool_dir: str | Path, *, nats_url: str | None = None,
                 root: str | Path | None = None, wait_s: float = 0.0, continue_spooled: bool = False) -> int:
    """The attempt a (re)started producer takes, claimed (`claim_attempt`): the first free one past every
    attempt known of it — spooled in `spool_dir`, stored by the ledger at `nats_url` (asked, waiting up
    to `wait_s`; RuntimeError if no ledger answers) and stored under `root`. With `continue_spooled`,
    the newest spooled chain is taken again when nothing newer is stored (its spool is the outbox of
    what it has not yet sent)."""
    spooled = spooled_attempts(spool_dir, run_id, producer)
    stored = ledger_attempts(run_id, producer, nats_url, wait_s) if nats_url is not None else []
    if root is not None:
        stored += stored_attempts(root, run_id, producer)
    if continue_spooled and spooled and max(spooled) >= max(stored, default=-1):
        return max(spooled)
    return claim_attempt(spool_dir, run_id, producer, max(spooled + stored, default=-1) + 1)


def claim_attempt(spool_dir: str | Path, run_id: str, producer: str, first: int) -> int:
    """The first attempt from `first` on whose spool folder this call made: `mkdir` is atomic, so of two
    processes claiming one number, one gets it and the other goes on to the next."""
    parent = Path(spool_dir) / run_id / producer
    parent.mkdir(parents=True, exist_ok=True)
    attempt = first
    while True:
        try:
            (parent / str(attempt)).mkdir()
            return attempt
        except FileExistsError:
            attempt += 1
