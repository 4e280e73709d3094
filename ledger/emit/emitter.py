"""The NATS sink: `Emitter.emit()` seals an event, appends it to the chain's spool and returns at once.

A thin facade over two parts: the spool (`runledger.ledger.emit.spool`, the durable outbox on local disk) and the
publisher (`runledger.ledger.emit.publisher`, a background thread sending the spool to JetStream and recording what
was acknowledged). An event `emit` accepted is never dropped: if NATS is slow or down, or this process
dies, it is published again later, and the ledger stores it once. Past `max_spool_bytes` of
unacknowledged events `emit` raises `SpoolFull`.

One process per chain: the spool holds its folder's lock, and a second Emitter on the same chain
fails at construction, naming the holder. Across machines the lock cannot reach, two producers on one
chain hand out the same seqs with different content; the ledger keeps the first and quarantines the
other as a conflict, and `close()` asks the ledger so that both producers are told: it returns False
and `conflicts` names the seqs. Once the ledger said it stored the whole chain, `close()` lets go
of its spool lines (`Spool.close(stored=True)`). Without a producer name the Emitter makes a unique one (host, pid,
random suffix); without an attempt it asks the ledger for the next one (`runledger.ledger.emit.chains.next_attempt`).

Signed chain heads (`runledger.ledger.tlog.chainheads`): the publisher's rounds seal a `chain_head` once EVERY events
or INTERVAL_S seconds with events followed the last one, and `close` / `hand_over` one over the rest (an offline
Emitter, which has no publisher, signs only there); `heads=False` (importers, `send_leftovers`) signs nothing.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import threading
import time
from pathlib import Path

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.contract.events import STREAM
from runledger.ledger.contract.roles import signs_heads
from runledger.ledger.storage import locks
from runledger.ledger.emit.chains import next_attempt
from runledger.ledger.emit.publisher import Publisher
from runledger.ledger.emit.sealing import seal, utc_now
from runledger.ledger.emit.sink import ChainSink
from runledger.ledger import settings
from runledger.ledger.emit.spool import Spool, SpoolFull, chain_dir
from runledger.ledger.tlog import chainheads

__all__ = ["Emitter", "SpoolFull", "origin", "prune_stored", "send_leftovers", "unique_producer"]

log = logging.getLogger(__name__)


def unique_producer() -> str:
    """A producer name no other process will make: host, pid and a random suffix (a valid name)."""
    host = re.sub(r"[^a-z0-9_-]+", "-", socket.gethostname().lower()).strip("-_")[:40] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


def origin(producer: str) -> dict:
    """Who a producer is, for `run_started.hardware`: host and pid beside the name."""
    return {"producer": producer, "host": socket.gethostname(), "pid": os.getpid()}


class Emitter(ChainSink):
    """Emit events for one (run_id, producer, attempt) chain through NATS; see the module docstring."""

    def __init__(
        self, run_id: str, producer: str | None = None, attempt: int | None = 0, nats_url: str | None = bus.DEFAULT_URL,
        spool_dir: str | Path = "./runledger-data/spool", max_spool_bytes: int = 512 << 20,
        batch: bool = True, confirm: bool = True, heads: bool | None = None,
    ) -> None:
        if producer is None:  # a fresh unique name has no chain anywhere yet: attempt 0
            producer, attempt = unique_producer(), 0
        elif attempt is None:
            attempt = next_attempt(run_id, producer, spool_dir, nats_url=nats_url)
        self.nats_url = nats_url
        self.confirm = confirm  # close() waits for the ledger's verdict on this chain (when a ledger answers)
        self.dir = chain_dir(spool_dir, run_id, producer, attempt)
        self.spool = Spool(self.dir, max_spool_bytes, f"; is NATS at {nats_url} reachable?")
        super().__init__(run_id, producer, attempt, self.spool.seq, self.spool.prev_hash)
        self._lock = _ChainLock(self)  # one lock for the chain: sealing and spooling are one step
        self.publisher = Publisher(self.spool, run_id, producer, attempt, nats_url, batch)
        # signed chain heads (runledger.ledger.tlog.chainheads): on the publisher's thread, and at close
        # (a worker's chain only: chain_head is a worker's kind, and an agent's, a person's or notify's name on
        # one is refused as speaking for them: runledger.ledger.contract.validation.speaker_problem)
        self.heads = (chainheads.enabled() if heads is None else heads) and signs_heads(producer)
        self._head_every, self._head_s = chainheads.every()
        self._head_next = self.spool.seq  # the seq after the last head (a reopened chain: nothing new yet)
        self._head_time = time.monotonic()
        self._head_signer: chainheads.HeadSigner | None = None  # made at the first head, off `log`'s thread
        self._head_introduced = False  # a head of this attempt key is sealed (the first carries the key and its vouch)
        self._signer_lock = threading.Lock()
        if self.heads:
            self.publisher.on_round = self._head_due
        if nats_url is not None:  # None: offline, the spool only (sent later: `runledger sync`, send_leftovers)
            self.spool.open_intake()  # (for `accept`: made here, not in the first `log`)
            self.publisher.start()
        else:
            self.publisher.stopped.set()

    def accept(self, kind: str, payload: dict, step: int | None = None) -> str:
        """`emit_dict` for `log`'s hot path: the event is in the spool's intake when this returns (it
        survives a SIGKILL from then on) and the publisher's thread seals it, in seq order, with the hash
        and text sealing here would give (`Spool.accept`). Only for payloads checked already (`log`'s,
        built by `metrics_payload`): a bad one is quarantined by the ledger, not refused here. Without a
        publisher (offline) it is sealed here."""
        if self.publisher.stopped.is_set():
            return self.emit_dict(kind, payload, step)
        spool = self.spool
        with spool.lock:
            seq = spool.accept(kind, payload, step, utc_now())
        return f"{self.run_id}:{self.producer}:{self.attempt}:{seq}"

    @property
    def next_seq(self) -> int:
        return self.spool.next_seq

    def hand_over(self) -> None:
        """Stop without waiting for NATS: seal and fsync what is spooled, stop the publisher (what it has
        in flight gets its acknowledgement for up to a second), and free the chain, leaving the rest for
        whoever opens it next (the root's supervisor sends it: `send_leftovers`)."""
        self.spool.seal_accepted()
        self.sign_head()
        if self.nats_url is not None:
            self.publisher.stop(None, 2.0)
        (self.dir / settings.HANDED_OVER).touch()  # (the commands that read the root wait for it: runledger.ledger.storing)
        self.spool.close(stored=False)

    @property
    def conflicts(self) -> set[int]:
        """Seqs of this chain where the ledger found a different event (known after close())."""
        return self.publisher.conflicts

    @property
    def confirmed(self) -> bool:
        """The ledger had processed everything published before close()."""
        return self.publisher.confirmed

    @property
    def refused(self) -> set[str]:
        """Subjects the server refused this producer (their events stay in the spool)."""
        return self.publisher.refused

    @property
    def published(self) -> int:
        """Messages acknowledged by JetStream (for progress and benches)."""
        return self.publisher.published

    def _keep(self, kind: str, ids: list[str], hashes: list[str], texts: list[bytes]) -> None:
        self.spool.append(kind, ids, hashes, texts)

    def pending(self) -> int:
        """Events emitted but not yet acknowledged by JetStream."""
        return self.spool.unacknowledged()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every event emitted so far is acknowledged; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.spool.acked_upto < self.spool.next_seq:
            if self.publisher.stopped.is_set() or (deadline is not None and time.monotonic() > deadline):
                return False
            time.sleep(0.005)
        return True

    def close(self, timeout: float = 30.0, say_unsent: bool = True) -> bool:
        """Flush (up to `timeout`), ask the ledger for its verdict on this chain (within the same
        `timeout`, if a ledger answers), then stop and free the chain. True only if JetStream has every
        event and the ledger has reported no conflict; unacknowledged events stay in the spool."""
        deadline = time.monotonic() + timeout
        self.sign_head()
        ok = self.flush(timeout)
        if self.nats_url is not None:
            self.publisher.stop(deadline if ok and self.confirm else None, max(10.0, deadline - time.monotonic() + 5))
        # the ledger's tables hold every event of the chain: the spool's copy goes (Spool.close)
        stored = (ok and self.nats_url is not None and self.confirmed and not self.conflicts
                  and self.publisher.stored_upto >= self.spool.seq)
        self.spool.close(stored=stored)
        if not ok and self.nats_url is not None and say_unsent:
            log.warning("emitter %s/%s closed with %d events unacknowledged (kept in %s)",
                        self.run_id, self.producer, self.spool.seq - self.spool.acked_upto, self.dir)
        if self.conflicts:
            log.error("chain %s:%s:%d: the ledger found conflicting events at seq %s: another producer wrote this "
                      "chain too; see `runledger verify`", self.run_id, self.producer, self.attempt,
                      _ranges(sorted(self.conflicts)))
        return ok and not self.conflicts

    def _head_due(self) -> None:
        """The publisher's round: a head once EVERY events, or INTERVAL_S seconds with events, followed the last.
        The first round makes the attempt's key (importing the signing code), so `log` never waits for it."""
        if self._head_signer is None:
            self._signer()
        new = self.spool.seq - self._head_next
        if new >= self._head_every or (new > 0 and time.monotonic() - self._head_time >= self._head_s):
            self.sign_head()

    def _signer(self) -> chainheads.HeadSigner | None:
        """The attempt's signer, made once (outside the chain lock: `accept` goes on meanwhile); None, heads
        off, if it cannot be made (said once)."""
        with self._signer_lock:
            if self._head_signer is None and self.heads:
                try:
                    self._head_signer = chainheads.HeadSigner(self.run_id, self.producer, self.attempt)
                except Exception as err:  # (the user's key unreadable, or readable by others)
                    self.heads = False
                    log.warning("chain %s:%s:%d: no signed chain heads: %s", self.run_id, self.producer, self.attempt, err)
            return self._head_signer

    def sign_head(self) -> None:
        """Seal a `chain_head` over the chain so far, if heads are on and an event followed the last head
        (a reopened chain's first head carries its new attempt key). A head that cannot be signed (the
        user's key unreadable) is said once and heads stop: the events go on unsigned."""
        if not self.heads or self.spool.next_seq <= self._head_next:
            return
        signer = self._signer()
        if signer is None:
            return
        try:
            with self._lock:  # (the chain lock: what was accepted is sealed first, so the head follows it)
                seq, prev = self._seq, self._prev_hash
                if seq <= self._head_next:
                    return
                payload = signer.payload(seq - 1, prev, not self._head_introduced)
                env, text = seal(self.run_id, self.producer, self.attempt, seq, chainheads.KIND, payload, None, prev)
                self._keep(chainheads.KIND, [env["event_id"]], [env["hash"]], [text.encode()])
                self._seq, self._prev_hash = seq + 1, env["hash"]
                self._head_next, self._head_time, self._head_introduced = seq + 1, time.monotonic(), True
        except Exception as err:  # (a full spool raises here too: the head comes later, with the next events)
            if isinstance(err, SpoolFull):
                return
            self.heads = False
            log.warning("chain %s:%s:%d: no signed chain heads from now on: %s", self.run_id, self.producer,
                        self.attempt, err)

    def __enter__(self) -> "Emitter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _ChainLock:
    """The Emitter's chain lock, as ChainSink takes it to seal an event inline: the spool's `sealing`,
    then its `lock`; what was accepted before is sealed first (so the inline event comes after it), and
    the sink's position is the spool's. On leaving, the spool's next accepted seq follows the event."""

    def __init__(self, emitter: "Emitter") -> None:
        self.emitter, self.spool = emitter, emitter.spool

    def __enter__(self) -> None:
        spool = self.spool
        spool.sealing.acquire()
        spool.lock.acquire()
        try:
            spool.seal_accepted_locked()
        except BaseException:
            self.__exit__()
            raise
        self.emitter._seq, self.emitter._prev_hash = spool.seq, spool.prev_hash

    def __exit__(self, *exc) -> None:
        self.spool.next_seq = self.spool.seq
        self.spool.lock.release()
        self.spool.sealing.release()


def _ranges(seqs: list[int]) -> str:
    """[1, 2, 3, 7] -> "1-3, 7"."""
    out, start = [], None
    for i, s in enumerate(seqs):
        if start is None:
            start = s
        if i + 1 == len(seqs) or seqs[i + 1] != s + 1:
            out.append(str(start) if start == s else f"{start}-{s}")
            start = None
    return ", ".join(out)


def leftover_chains(spool_dir: str | Path, run_id: str | None = None) -> list[tuple[str, str, int]]:
    """Chains in a spool (of one run, or all) that may hold events no one is sending: no process holds
    the chain, and its last segment was written after it recorded what was acknowledged (as when a
    producer was killed). A chain closed cleanly records its acknowledged bound last, so it is left out."""
    found = []
    for d in sorted(Path(spool_dir).glob(f"{run_id or '*'}/*/*")):
        segments = sorted(d.glob("seg-*.jsonl"))
        intake = any(d.glob("in-*.jsonl"))  # accepted events a killed process never sealed (Spool.accept)
        if not d.name.isdigit() or not (segments or intake):
            continue
        acked = d / "acked"
        if not intake and acked.exists() and acked.stat().st_mtime_ns >= segments[-1].stat().st_mtime_ns:
            continue
        if not locks.is_held(d / "lock"):
            found.append((d.parent.parent.name, d.parent.name, int(d.name)))
    return found


def send_leftovers(spool_dir: str | Path, nats_url: str, run_id: str | None = None, timeout: float = 30.0,
                   unopenable: set | None = None) -> int:
    """Publish what dead producers left unacknowledged in a spool (of one run, or all): each such chain
    is opened as its producer would reopen it, flushed and closed. Returns the events sent. With a set
    `unopenable`, a folder that cannot be opened as a chain (not a chain's name, unreadable) is logged
    once, added to it and skipped from then on, rather than raised."""
    sent = 0
    for run, producer, attempt in leftover_chains(spool_dir, run_id):
        if unopenable is not None and (run, producer, attempt) in unopenable:
            continue
        try:
            em = Emitter(run, producer, attempt, nats_url, spool_dir, confirm=False, heads=False)  # (it signs nothing)
        except locks.Busy:  # its producer came back meanwhile
            continue
        except (OSError, ValueError) as err:
            if unopenable is None:
                raise
            unopenable.add((run, producer, attempt))
            log.warning("spool chain %s/%s/%d cannot be opened, left as it is: %s", run, producer, attempt, err)
            continue
        pending = em.pending()
        if em.close(timeout):
            sent += pending
            if pending:
                log.info("sent %d events that %s:%s:%d had left in its spool", pending, run, producer, attempt)
    return sent


RETRY_FIRST_S = 0.5  # prune_stored: a chain the ledger had not stored yet is asked again after this...
RETRY_MAX_S = 30.0  # ...twice as long each time after, up to this


def unconfirmed_chains(spool_dir: str | Path, seen: dict | None = None) -> list[tuple[str, str, int, int]]:
    """Chains in a spool whose lines may all be stored by now, though no one was told: closed (no process
    holds them, their acknowledged bound recorded after their last line), segments still there. (run,
    producer, attempt, acknowledged bound). With `seen` (chain -> (the `acked` file's mtime when last
    found not stored, when to ask again, the wait after that)), a chain not changed since is left out
    until it is time to ask again."""
    found = []
    now = time.monotonic()
    for d in sorted(Path(spool_dir).glob("*/*/*")):
        segments = sorted(d.glob("seg-*.jsonl"))
        acked = d / "acked"
        if not d.name.isdigit() or not segments or not acked.exists():
            continue
        mtime = acked.stat().st_mtime_ns
        chain = (d.parent.parent.name, d.parent.name, int(d.name))
        if mtime < segments[-1].stat().st_mtime_ns:
            continue
        if seen is not None and chain in seen and seen[chain][0] == mtime and now < seen[chain][1]:
            continue
        try:
            upto = int(acked.read_text())
        except (OSError, ValueError):
            continue
        if not locks.is_held(d / "lock"):
            found.append((*chain, upto))
    return found


def _not_yet(seen: dict | None, chain: tuple, d: Path) -> None:
    """Remember a chain the ledger had not stored when asked: ask again later, waiting longer each time."""
    if seen is None or not (d / "acked").exists():
        return
    mtime = (d / "acked").stat().st_mtime_ns
    wait = RETRY_FIRST_S if chain not in seen or seen[chain][0] != mtime else min(seen[chain][2] * 2, RETRY_MAX_S)
    seen[chain] = (mtime, time.monotonic() + wait, wait)


def prune_stored(spool_dir: str | Path, nats_url: str, seen: dict | None = None) -> int:
    """Let go of the spool lines of closed chains the ledger has stored since (a run finished before
    the ledger confirmed it, a dead producer's chain sent by `send_leftovers`): each is asked of the
    ledger, and opened (its lock taken) and pruned only if the ledger stored every seq it holds. Returns
    the chains pruned; `seen` remembers the others, asked again after a wait that doubles each time
    (RETRY_FIRST_S to RETRY_MAX_S), or when their spool changes."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from runledger.ledger.emit.chains import ask_ledger

    chains = unconfirmed_chains(spool_dir, seen)
    if not chains:
        return 0

    async def ask() -> dict:
        nc = await bus.connect(nats_url, name="spool-prune", max_reconnect_attempts=0)
        try:  # (the stream's end first: a chain counts as stored once the ledger has committed up to it)
            end = (await nc.jetstream().stream_info(STREAM)).state.last_seq
            return {(run, producer): await ask_ledger(nc, run, producer) for run, producer in {c[:2] for c in chains}}, end
        finally:
            await nc.close()

    with ThreadPoolExecutor(1) as pool:  # its own loop: the caller may be inside one
        answers, end = pool.submit(asyncio.run, ask()).result()
    pruned = 0
    for run, producer, attempt, upto in chains:
        status = answers.get((run, producer)) or {}
        mine = status.get("chains", {}).get(str(attempt), {})
        d = chain_dir(spool_dir, run, producer, attempt)
        # stored, and committed (its tables readable): the ledger has acknowledged the stream up to its end
        if mine.get("conflicts") or mine.get("stored_upto", 0) < upto or status.get("ack_floor", 0) < end:
            _not_yet(seen, (run, producer, attempt), d)
            continue
        try:
            spool = Spool(d, 1 << 62)
        except (locks.Busy, OSError, ValueError):
            continue
        # every line it holds stored, and every one acknowledged by JetStream (so the ledger has seen each
        # and would have named a conflict: a line never sent is not taken as stored under its seq)
        stored = spool.seq <= mine["stored_upto"] and not spool.pending
        spool.close(stored=stored)
        pruned += stored
        if not stored:
            _not_yet(seen, (run, producer, attempt), d)
        if stored:
            log.info("spool chain %s/%s/%d: the ledger stored its %d events; its spool lines are gone", run, producer,
                     attempt, spool.seq)
    return pruned
