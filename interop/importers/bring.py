"""Bringing a source run into the ledger once: what is held already is compared, only what is new is emitted.

An import is one chain, (run_id, `import-tb`|`import-mlflow`|`import-wandb`, attempt 0), so its event
ids are the source's identity: the run id comes from the source's run id and seq k is the k-th event
of the source read in its fixed order (`runledger.interop.importers.source`). Before emitting, the chain the
ledger holds (its Parquet files, and this machine's spool of events not yet acknowledged) is compared
with the source, event by event (kind, step, time and canonical payload):

- every held event equals the source's at that place: the source's events after them are emitted,
  continuing the chain from its head (a second import of the same source emits nothing);
- a held `run_finished` closes an earlier import; a source that grew since goes on after it with its
  new points and a new `run_finished` (the latest one is the run's end);
- the run_started may differ in the source's URI alone (the same source, moved);
- a held event differs from the source's: the source changed rather than grew, and the import is
  refused with a one-line reason (`ImportRefused`): the chain is never forked.

An import is all or nothing: every event to emit is sealed first as the Emitter will seal it (the
producer's checks: names, times, positions, payloads) and held to the ledger's size limit, before
the first is sent; one that fails refuses the whole import (`ImportRefused`), and nothing is sent.

Events go through the real path: the NATS `Emitter` (spool, then JetStream, then the ledger, which
stores each event once), on the root's embedded local server and ledger unless a server is given.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from runledger.ledger.bus import jetstream as bus
from runledger.ledger import local, settings
from runledger.ledger.storage import locks, reads
from runledger.ledger.contract.canonical import canonical_json, envelope_text
from runledger.ledger.emit.chains import ask_ledger
from runledger.ledger.emit.emitter import Emitter
from runledger.ledger.contract.events import MAX_EVENT_BYTES, InvalidEvent
from runledger.ledger.redact import redact
from runledger.ledger.emit.sink import ChainSink
from runledger.ledger.emit.spool import chain_dir
from runledger.ledger.storage.files import fsync_dir

from runledger.interop.importers.source import IMPORT_KEY, SourceEvent, SourceRun

log = logging.getLogger(__name__)

BUSY_WAIT_S = 30.0  # for the supervisor to finish sending an earlier import's leftovers (its close() waits 30 s)
BUSY_RETRY_S = 0.5
STORED_POLL_S = 0.1  # how often to ask the ledger how far it has stored the import
LEDGER_WAIT_S = 60.0  # for the ledger to answer (the root's local one may be starting)
ATTEMPT = 0  # an import's chain is always attempt 0: the same source point keeps the same event id
CLOSE_S_MIN = 60.0  # the least time given to the ledger to confirm an import...
EVENTS_PER_S_FLOOR = 500  # ...plus one second per this many events (well under a loaded machine's rate)
_SEQ = re.compile(rb',"seq":(\d+),"step":')  # an envelope's seq in its canonical text
_COLUMNS = ["event_id", "run_id", "producer", "attempt", "seq", "kind", "time", "step", "schema_version", "prev_hash",
            "hash", "payload"]


class ImportRefused(ValueError):
    """The source is not the one the ledger holds grown at its end: the one-line reason."""


@dataclass(frozen=True)
class Held:
    """An event of the import's chain that the ledger holds (or this machine's spool will send)."""

    seq: int
    kind: str
    step: int | None
    time: str
    payload_text: str
    hash: str
    envelope: dict  # the whole envelope, its payload as text under "payload"


@dataclass
class Imported:
    """What an import did: the run, its events, how many were held before and how many it emitted."""

    run_id: str
    producer: str
    source_events: int
    held_before: int
    emitted: int
    skipped: dict[str, int]
    confirmed: bool = True  # the ledger said it stored every event emitted

    def line(self) -> str:
        skipped = "".join(f"; skipped {n} {why}" for why, n in sorted(self.skipped.items()))
        return (f"{self.run_id}: {self.emitted} new events imported ({self.held_before} held already, "
                f"{self.source_events} in the source){skipped}")


def held_events(root: Path, run_id: str, producer: str) -> list[Held]:
    """The import chain's events the ledger holds under `root`, and those this machine's spool holds
    beyond them (sent later), in seq order."""
    held: dict[int, Held] = {}
    try:
        t = reads.read_events(Path(root), run_id=run_id, columns=_COLUMNS)
    except (OSError, ValueError):  # no ledger under root yet
        t = None
    if t is not None and t.num_rows:
        t = t.filter(_mask(t, producer))
        for row in t.to_pylist():
            held[row["seq"]] = Held(row["seq"], row["kind"], row["step"], row["time"], row["payload"], row["hash"], row)
    for seg in sorted(chain_dir(settings.spool_dir(root), run_id, producer, ATTEMPT).glob("seg-*.jsonl")):
        for line in seg.read_bytes().splitlines():
            seq = _SEQ.search(line)
            if seq is not None and int(seq.group(1)) in held:  # stored already: no need to parse it
                continue
            try:
                env = json.loads(line)
            except ValueError:  # a torn last line: the emit that wrote it never returned
                continue
            if env["seq"] not in held:
                text = canonical_json(env["payload"])
                held[env["seq"]] = Held(env["seq"], env["kind"], env["step"], env["time"], text, env["hash"],
                                        {**env, "payload": text})
    seqs = sorted(held)
    if seqs != list(range(len(seqs))):
        missing = sorted(set(range(seqs[-1] + 1)) - set(seqs))[:5]
        raise ImportRefused(f"the ledger holds chain {run_id}:{producer}:{ATTEMPT} with seqs {missing} missing "
                            "(an earlier import still in flight?): try again once `runledger verify` passes")
    return [held[s] for s in seqs]


def _mask(t, producer: str):
    import pyarrow.compute as pc

    return pc.and_(pc.equal(t.column("producer"), producer), pc.equal(t.column("attempt"), ATTEMPT))


def _same(h: Held, e: SourceEvent) -> bool:
    if not (h.kind == e.kind and h.step == e.step and h.time == e.time):
        return False
    if h.payload_text == canonical_json(e.payload):
        return True
    return h.kind == "run_started" and _moved(json.loads(h.payload_text)) == _moved(e.payload)


def _moved(payload: dict) -> dict:
    """A run_started payload less the source's URI (and the config hash over it): the same source read
    from where it was moved to is the same run."""
    config = dict(payload.get("config", {}))
    config[IMPORT_KEY] = {k: v for k, v in config.get(IMPORT_KEY, {}).items() if k != "uri"}
    return {**payload, "config": config, "config_hash": None}


def _describe(e: SourceEvent | Held | None) -> str:
    if e is None:
        return "nothing"
    return f"{e.kind} at step {e.step} ({e.time})"


def plan(held: list[Held], events: list[SourceEvent], run_id: str) -> list[SourceEvent]:
    """The source events to emit after the held ones (see the module docstring); ImportRefused if the
    source is not the held one grown."""
    held_points = [h for h in held if h.kind != "run_finished"]
    points = [e for e in events if e.kind != "run_finished"]
    finish = events[-1] if events and events[-1].kind == "run_finished" else None
    for i, h in enumerate(held_points):
        e = points[i] if i < len(points) else None
        if e is None or not _same(h, e):
            raise ImportRefused(
                f"run {run_id}: the source changed, not grew: the ledger holds {_describe(h)} at seq {h.seq}, the source "
                f"has {_describe(e)} there; refusing to fork the import (import it as another run with --run-id)")
    new = points[len(held_points):]
    if finish is not None and (new or not held or not _same(held[-1], finish)):
        new.append(finish)
    return new


def seed_spool(spool_dir: Path, head: Held, run_id: str, producer: str) -> None:
    """Start this machine's spool of the chain at the head the ledger holds (imported from another machine,
    or a spool cleared): one segment holding that event, acknowledged, as `runledger.ledger.emit.spool` lays a chain out
    (seg-{seq}.jsonl, `acked`), so the Emitter goes on from the next seq, chained to its hash."""
    d = chain_dir(spool_dir, run_id, producer, ATTEMPT)
    d.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in head.envelope.items() if k != "payload"}
    text = envelope_text({**env, "payload": None}, head.payload_text, with_hash=True)
    # under the chain's lock, as a Spool writes it: a local supervisor looking for chains that dead
    # producers left (emitter.leftover_chains) must not take the segment before `acked` is there
    lock = locks.hold(d / "lock", f"chain {run_id}:{producer}:{ATTEMPT} (spool {d})", wait_s=locks.PROBE_S)
    try:
        for name, data in ((f"seg-{head.seq:012d}.jsonl", text + "\n"), ("acked", str(head.seq + 1))):
            tmp = d / f".{name}.tmp"
            with open(tmp, "w") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, d / name)
        fsync_dir(d)
    finally:
        lock.release()


def bring(run: SourceRun, root: str | Path, nats_url: str | None = None, run_id: str | None = None) -> Imported:
    """Import `run` into the ledger at `root` (through `nats_url`, else the root's local server and
    ledger) as run `run_id` (default: the source's); see the module docstring."""
    root = Path(root)
    run_id = run_id or run.run_id
    producer = run.producer
    held = held_events(root, run_id, producer)
    new = plan(held, run.events, run_id)
    result = Imported(run_id, producer, len(run.events), len(held), 0, dict(run.skipped))
    if not new:
        return result
    check_sealable(new, run_id, producer, held[-1] if held else None)
    spool = settings.spool_dir(root)
    d = chain_dir(spool, run_id, producer, ATTEMPT)
    if held and not any(d.glob("seg-*.jsonl")):
        seed_spool(spool, held[-1], run_id, producer)
    attachment = None if nats_url else local.attach(root)
    try:
        url = nats_url or attachment.url
        known = stored_upto(url, run_id, producer, None, LEDGER_WAIT_S)
        if known is None:
            raise ImportRefused(f"no ledger answers at {redact(url)}: start `runledger ledger serve` (or leave --nats "
                                "out for the root's own local one)")
        if known > len(held):  # a remote ledger whose root is not --root: it holds what cannot be compared here
            raise ImportRefused(f"the ledger at {redact(url)} holds {known} events of {run_id}:{producer} but {root} "
                                f"shows {len(held)}: pass the ledger's own --root")
        em = _emitter(run_id, producer, url, spool)
        if em.next_seq != len(held):  # this machine's spool is behind what the ledger holds
            em.close(0)
            raise ImportRefused(f"the spool {d} ends at seq {em.next_seq - 1} but the ledger holds the chain up to "
                                f"seq {len(held) - 1}: remove that folder (nothing in it is unsent) and import again")
        timeout = max(CLOSE_S_MIN, len(new) / EVENTS_PER_S_FLOOR)
        try:
            _emit(em, new)
            result.emitted = len(new)
        finally:  # (what was emitted before a failure is in the spool, sent now or by the next import)
            closed = em.close(timeout)
            result.confirmed = closed and (stored_upto(url, run_id, producer, em.next_seq, timeout) or 0) >= em.next_seq
    finally:
        if attachment is not None:
            attachment.release()
    if not result.confirmed:
        log.warning("run %s: the ledger has not confirmed every imported event yet; they stay in the spool and are "
                    "sent later", run_id)
    return result


class Trial(ChainSink):
    """A chain that seals as the Emitter does and keeps nothing: the events it takes are storable, or
    it raises InvalidEvent (the ledger's size limit included)."""

    def _keep(self, kind: str, ids: list[str], hashes: list[str], texts: list[bytes]) -> None:
        for event_id, text in zip(ids, texts):
            if len(text) > MAX_EVENT_BYTES:
                raise InvalidEvent(f"{event_id}: {len(text):,} bytes, over the ledger's {MAX_EVENT_BYTES:,}-byte limit")


def check_sealable(events: list[SourceEvent], run_id: str, producer: str, head: Held | None) -> None:
    """ImportRefused naming the first of `events` the chain after `head` could not store; nothing sent."""
    trial = Trial(run_id, producer, ATTEMPT, head.seq + 1 if head else 0, head.hash if head else "")
    try:
        _emit(trial, events)
    except InvalidEvent:
        for e in events:  # (rare: find the one to name)
            try:
                Trial(run_id, producer, ATTEMPT, trial.next_seq).emit_dict(e.kind, e.payload, e.step, e.time)
            except InvalidEvent as err:
                raise ImportRefused(f"run {run_id}: the source's {_describe(e)} cannot be stored ({err}); nothing "
                                    "imported: fix the source and import again") from None
        raise


def stored_upto(url: str, run_id: str, producer: str, at_least: int | None, timeout: float) -> int | None:
    """How many of the import chain's events the ledger says it has stored (its seqs below that number),
    asked until it answers (at_least None) or says at least `at_least` (asking again while a busy ledger
    is slow to answer); None if no ledger answered by `timeout`."""
    import asyncio

    async def ask() -> int | None:
        nc = await bus.connect(url, name=f"import-{producer}", max_reconnect_attempts=0)
        try:
            deadline, known = time.monotonic() + timeout, None
            while True:
                status = await ask_ledger(nc, run_id, producer)
                if status is not None:
                    known = status["chains"].get(str(ATTEMPT), {}).get("stored_upto", 0)
                    if at_least is None or known >= at_least:
                        return known
                if time.monotonic() > deadline:
                    return known
                await asyncio.sleep(STORED_POLL_S)
        finally:
            await nc.close()

    with ThreadPoolExecutor(1) as pool:  # its own loop: the caller may be inside one
        return pool.submit(asyncio.run, ask()).result()


def _emitter(run_id: str, producer: str, url: str, spool: Path) -> Emitter:
    """The chain's Emitter, waiting (up to BUSY_WAIT_S) while the root's supervisor sends what an earlier,
    killed import left in its spool; locks.Busy if another import holds it that long."""
    deadline = time.monotonic() + BUSY_WAIT_S
    while True:
        try:
            return Emitter(run_id, producer, ATTEMPT, url, spool, heads=False)  # (an imported run is unsigned)
        except locks.Busy:
            if time.monotonic() > deadline:
                raise
            time.sleep(BUSY_RETRY_S)


def _emit(em: ChainSink, events: list[SourceEvent]) -> None:
    """Emit in order; consecutive events of one kind and one time are sealed together."""
    i = 0
    while i < len(events):
        first = events[i]
        j = i + 1
        while j < len(events) and events[j].kind == first.kind and events[j].time == first.time:
            j += 1
        if j - i == 1:
            em.emit_dict(first.kind, first.payload, first.step, first.time)
        else:
            em.emit_dicts(first.kind, [e.payload for e in events[i:j]], [e.step for e in events[i:j]], first.time)
        i = j
