"""The producer side: `Emitter.emit()` seals an event, appends it to a local spool and returns at once.

A background thread publishes spooled events to JetStream and records which were acknowledged. The
Nats-Msg-Id is the event_id with the event's hash (a batch: its first event_id, its length and its last
hash), so JetStream's dedupe drops only a resend of the same bytes: no one, of any role, can make an
event disappear by sending another message under its id first. The spool is the outbox: an event that `emit` accepted is in the spool file
(written before `emit` returns, fsync'd in batches), so if NATS is slow or down, or this process dies,
it is published again later — by this Emitter's retries, or by the next Emitter opened on the same
spool. NATS dedupes resends within its window and the ledger dedupes by event_id after it, so the
ledger stores each event once. Past `max_spool_bytes` of unacknowledged events `emit` raises
`SpoolFull`; nothing is ever dropped.

When events pile up (a fast producer, or NATS coming back), events of one kind are sent together
as one message: a JSON array on the same subject `runledger.{run_id}.{kind}`, each element still a
whole envelope with its own event_id (so subject permissions hold for batches too).

One process per chain: an Emitter holds the lock of its spool folder ({run_id}/{producer}/{attempt}/
lock, released by the OS when the process dies), and a second Emitter on the same chain fails at
construction, naming the holder. Across machines the lock cannot reach, two producers on one chain
hand out the same seqs with different content; the ledger keeps the first and quarantines the other as
a conflict, and `close()` asks the ledger ({LEDGER_API}.chains...) so that both producers are told:
it returns False and `conflicts` names the seqs. Without a producer name the Emitter makes a unique
one (host, pid, random suffix); without an attempt it asks the ledger for the next one.

Spool layout: {spool_dir}/{run_id}/{producer}/{attempt}/seg-{first_seq}.jsonl (one canonical
envelope per line), `acked` (every seq below this number is acknowledged) and `lock`.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import itertools
import json
import logging
import operator
import os
import re
import secrets
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from nats.errors import NoRespondersError, TimeoutError as NatsTimeout

from ledger import bus, locks
from ledger.redact import redact
from ledger.events import STREAM, seal, seal_many, subject_for
from ledger.natsserver import LEDGER_API
from ledger.store import fsync_dir

log = logging.getLogger(__name__)

SEGMENT_EVENTS = 20_000  # events per spool segment file
MAX_BATCH_EVENTS = 1_000  # events per NATS message when there is a backlog
MAX_BATCH_BYTES = 512 << 10
MAX_INFLIGHT = 256  # unacknowledged messages in flight
ACK_TIMEOUT_S = 5.0  # resend a message whose PubAck has not come by then
FSYNC_INTERVAL_S = 0.2
CONFIRM_POLL_S = 0.05  # close(): how often to ask the ledger how far it has got
ASK_TIMEOUT_S = 2.0  # one request to the ledger
IO_SLICE_S = 0.001  # while busy: the event loop runs this long per round...
TICK_S = 0.01  # ...and the thread sleeps this long between rounds


class SpoolFull(RuntimeError):
    """More unacknowledged events than the spool may hold; the event was not accepted."""


class _Spooled(NamedTuple):  # (a tuple: emit_many makes many, and a tuple is made fastest)
    seq: int
    kind: str
    event_id: str
    data: bytes  # canonical envelope text, no newline
    hash: str


def batch_msg_id(items: list[_Spooled]) -> str:
    """A batch's: its first event, its length and its last hash (which the chain ties to every entry)."""
    return f"{items[0].event_id}+{len(items)}:{items[-1].hash}"


def unique_producer() -> str:
    """A producer name no other process will make: host, pid and a random suffix (a valid name)."""
    host = re.sub(r"[^a-z0-9_-]+", "-", socket.gethostname().lower()).strip("-_")[:40] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


def origin(producer: str) -> dict:
    """Who a producer is, for `run_started.hardware`: host and pid beside the name."""
    return {"producer": producer, "host": socket.gethostname(), "pid": os.getpid()}


async def ask_ledger(nc, run_id: str, producer: str) -> dict | None:
    """The ledger's view of (run_id, producer): {"ack_floor": stream seq, "chains": {attempt: {"stored_upto",
    "conflicts"}}}; None if no ledger answers."""
    try:
        reply = await nc.request(f"{LEDGER_API}.chains.{run_id}.{producer}", b"", timeout=ASK_TIMEOUT_S)
    except (NoRespondersError, NatsTimeout):
        return None
    return json.loads(reply.data)


def next_attempt(run_id: str, producer: str, nats_url: str, spool_dir: str | Path) -> int:
    """The attempt a (re)started producer takes: one past every attempt the ledger has stored for it,
    and past those in this machine's spool (not yet stored, perhaps). Raises RuntimeError if no ledger
    answers: the attempt is the ledger's to say, not a guess."""
    async def ask() -> dict | None:
        nc = await bus.connect(nats_url, name=f"emitter-{producer}", max_reconnect_attempts=0)
        try:
            return await ask_ledger(nc, run_id, producer)
        finally:
            await nc.close()

    with ThreadPoolExecutor(1) as pool:  # its own loop: the caller may be inside one
        status = pool.submit(asyncio.run, ask()).result()
    if status is None:
        raise RuntimeError(f"cannot learn the next attempt of {run_id}:{producer}: no ledger answers at "
                           f"{redact(nats_url)}; start `runledger ledger serve` or pass attempt=")
    d = Path(spool_dir) / run_id / producer
    spooled = [int(p.name) for p in d.glob("*") if p.name.isdigit()] if d.exists() else []
    return max([int(a) for a in status["chains"]] + spooled, default=-1) + 1


_SEQ, _KIND, _DATA = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(3)  # a _Spooled's fields, fast


class Emitter:
    """Emit events for one (run_id, producer, attempt) chain; see the module docstring."""

    def __init__(
        self, run_id: str, producer: str | None = None, attempt: int | None = 0, nats_url: str = bus.DEFAULT_URL,
        spool_dir: str | Path = "./runledger-data/spool", max_spool_bytes: int = 512 << 20,
        batch: bool = True, confirm: bool = True,
    ) -> None:
        if producer is None:  # a fresh unique name has no chain anywhere yet: attempt 0
            producer, attempt = unique_producer(), 0
        elif attempt is None:
            attempt = next_attempt(run_id, producer, nats_url, spool_dir)
        self.run_id, self.producer, self.attempt = run_id, producer, attempt
        self.nats_url = nats_url
        self.max_spool_bytes = max_spool_bytes
        self.batch = batch
        self.confirm = confirm  # close() waits for the ledger's verdict on this chain (when a ledger answers)
        self.dir = Path(spool_dir) / run_id / producer / str(attempt)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._chain_lock = locks.hold(self.dir / "lock", f"chain {run_id}:{producer}:{attempt} (spool {self.dir})")
        self.conflicts: set[int] = set()  # seqs of this chain where the ledger found a different event
        self.confirmed = False  # the ledger had processed everything published before close()
        self._confirm_by: float | None = None
        try:
            self._open()
        except BaseException:
            self._chain_lock.release()
            raise

    def _open(self) -> None:
        """The spool's state, then the publisher thread (the chain's lock is held)."""
        run_id, producer = self.run_id, self.producer
        self._lock = threading.Lock()
        self._pending: collections.deque[_Spooled] = collections.deque()
        self._unacked_bytes = 0
        self._acked: set[int] = set()
        self._acked_upto = self._read_acked()
        self._seq, self._prev_hash = 0, ""
        self._seg_fd: int | None = None
        self._seg_bytes = 0  # the open segment's size
        self._seg_first = 0
        self._dirty = False
        self._recover_spool()
        self._closing = threading.Event()
        self._stopped = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._idle = True
        self._next_key = 0
        self.refused: set[str] = set()  # subjects the server refused us (see _on_error)
        self.published = 0  # messages acknowledged by JetStream (for progress and benches)
        self._thread = threading.Thread(target=self._thread_main, name=f"emitter-{run_id}-{producer}", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- producer-facing API

    @property
    def next_seq(self) -> int:
        return self._seq

    def emit(self, kind: str, payload: dict, step: int | None = None) -> str:
        """Seal and spool one event; return its event_id. Never waits for NATS."""
        with self._lock:
            env, text = seal(self.run_id, self.producer, self.attempt, self._seq, kind, payload, step, self._prev_hash)
            self._spool(kind, [env["event_id"]], [env["hash"]], [text.encode()])
        self._wake_publisher()
        return env["event_id"]

    def emit_many(self, kind: str, payloads: list[dict], steps: list[int | None] | None = None) -> list[str]:
        """Seal and spool several events of one kind at once, in order; return their event_ids.

        For high-rate producers: the same events as `emit` for each in turn (each its own event_id,
        seq and hash), sharing one `time`, at a fraction of the CPU (one validation call, one orjson
        call, one spool write). All or nothing: a bad payload raises InvalidEvent and spools none.
        """
        if not payloads:
            return []
        with self._lock:
            ids, hashes, texts = seal_many(self.run_id, self.producer, self.attempt, self._seq, kind, payloads, steps,
                                           self._prev_hash)
            self._spool(kind, ids, hashes, texts)
        self._wake_publisher()
        return ids

    def _spool(self, kind: str, ids: list[str], hashes: list[str], texts: list[bytes]) -> None:
        """Append sealed events (the next seqs) to the spool and the queue; under the lock."""
        data = b"\n".join(texts) + b"\n"
        if self._unacked_bytes + len(data) > self.max_spool_bytes:
            raise SpoolFull(
                f"spool {self.dir} holds {self._unacked_bytes} bytes of unacknowledged events "
                f"(limit {self.max_spool_bytes}); is NATS at {self.nats_url} reachable?"
            )
        if self._seg_fd is None or self._seq - self._seg_first >= SEGMENT_EVENTS:
            self._open_segment(self._seq)
        self._append(data)
        self._dirty = True
        n = len(ids)
        self._pending.extend(map(_Spooled, range(self._seq, self._seq + n), [kind] * n, ids, texts, hashes))
        self._unacked_bytes += len(data) - n
        self._seq += n
        self._prev_hash = hashes[-1]

    def _wake_publisher(self) -> None:
        if self._idle and self._loop is not None:
            self._idle = False
            self._loop.call_soon_threadsafe(self._wake.set)

    def pending(self) -> int:
        """Events emitted but not yet acknowledged by JetStream."""
        return self._seq - self._acked_upto - len(self._acked)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every event emitted so far is acknowledged; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._acked_upto < self._seq:
            if self._stopped.is_set() or (deadline is not None and time.monotonic() > deadline):
                return False
            time.sleep(0.005)
        return True

    def close(self, timeout: float = 30.0) -> bool:
        """Flush (up to `timeout`), ask the ledger for its verdict on this chain (within the same
        `timeout`, if a ledger answers), then stop and free the chain. True only if JetStream has every
        event and the ledger has reported no conflict; unacknowledged events stay in the spool."""
        deadline = time.monotonic() + timeout
        ok = self.flush(timeout)
        self._confirm_by = deadline if ok and self.confirm else None
        self._closing.set()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)
        self._thread.join(max(10.0, deadline - time.monotonic() + 5))
        with self._lock:
            self._sync_segment()
            if self._seg_fd is not None:
                os.close(self._seg_fd)
                self._seg_fd = None
        self._write_acked()
        self._chain_lock.release()
        if not ok:
            log.warning("emitter %s/%s closed with %d events unacknowledged (kept in %s)",
                        self.run_id, self.producer, self._seq - self._acked_upto, self.dir)
        if self.conflicts:
            log.error("chain %s:%s:%d: the ledger found conflicting events at seq %s: another producer wrote this "
                      "chain too; see `runledger verify`", self.run_id, self.producer, self.attempt,
                      _ranges(sorted(self.conflicts)))
        return ok and not self.conflicts

    def __enter__(self) -> "Emitter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- spool

    def _read_acked(self) -> int:
        try:
            return int((self.dir / "acked").read_text())
        except (OSError, ValueError):
            return 0

    def _write_acked(self) -> None:
        tmp = self.dir / ".acked.tmp"
        tmp.write_text(str(self._acked_upto))
        os.replace(tmp, self.dir / "acked")
        segments = self._segments()
        for seg, nxt in zip(segments, segments[1:]):  # done once the next segment starts at or below acked
            if int(nxt.stem[4:]) <= self._acked_upto:
                seg.unlink(missing_ok=True)

    def _segments(self) -> list[Path]:
        return sorted(self.dir.glob("seg-*.jsonl"))

    def _recover_spool(self) -> None:
        """Continue the chain where the spool left it, and queue what was never acknowledged."""
        for seg in self._segments():
            raw = seg.read_bytes()
            if raw and not raw.endswith(b"\n"):  # a torn last line: emit never returned for it
                raw = raw[: raw.rfind(b"\n") + 1]
                with open(seg, "r+b") as f:
                    f.truncate(len(raw))
            for line in raw.splitlines():
                env = json.loads(line)
                self._seq, self._prev_hash = env["seq"] + 1, env["hash"]
                if env["seq"] >= self._acked_upto:
                    self._pending.append(_Spooled(env["seq"], env["kind"], env["event_id"], line, env["hash"]))
                    self._unacked_bytes += len(line)
        if self._pending:
            log.info("spool %s: %d unacknowledged events will be published again", self.dir, len(self._pending))
        self._acked_upto = min(self._acked_upto, self._seq)

    def _open_segment(self, first: int) -> None:
        self._sync_segment()
        if self._seg_fd is not None:
            os.close(self._seg_fd)
        self._seg_first = first
        self._seg_fd = os.open(self.dir / f"seg-{first:012d}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._seg_bytes = os.fstat(self._seg_fd).st_size  # (no lseek per write: it waits out a concurrent fsync)
        fsync_dir(self.dir)

    def _append(self, data: bytes) -> None:
        """Append whole lines to the segment, or nothing (a failed write, e.g. a full disk, is cut off)."""
        try:
            written = os.write(self._seg_fd, data)
            while written < len(data):
                written += os.write(self._seg_fd, data[written:])
        except BaseException:
            os.ftruncate(self._seg_fd, self._seg_bytes)
            raise
        self._seg_bytes += len(data)

    def _sync_segment(self) -> None:
        if self._seg_fd is not None and self._dirty:
            os.fsync(self._seg_fd)
            self._dirty = False

    def _sync_outside_lock(self) -> None:
        """fsync the spool without holding up `emit` (a disk flush takes milliseconds): on a duplicate
        of the segment's descriptor, so a segment rotated meanwhile is still the one synced."""
        with self._lock:
            if self._seg_fd is None or not self._dirty:
                return
            fd = os.dup(self._seg_fd)
            self._dirty = False
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # ---------------------------------------------------------------- publisher thread

    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._wake = asyncio.Event()
        try:
            loop.run_until_complete(self._publish_loop())
        except Exception:  # the thread must not die silently: the spool keeps the events
            log.exception("emitter publisher stopped")
        finally:
            self._stopped.set()
            loop.close()

    async def _connect(self):
        while not self._closing.is_set():
            nc = None
            try:
                nc = await bus.connect(self.nats_url, name=f"emitter-{self.producer}", error_cb=self._on_error)
                js = nc.jetstream(publish_async_max_pending=MAX_INFLIGHT * 2)
                await bus.ensure_stream(js)
                return nc, js
            except Exception as err:  # server down, or no stream yet: keep the events spooled, try again
                log.debug("emitter: NATS at %s not ready (%s)", self.nats_url, err)
                if nc is not None:
                    await nc.close()
                await asyncio.sleep(0.25)
        return None, None

    async def _on_error(self, err: Exception) -> None:
        """A publish the server refused (no permission) is reported; its events stay in the spool."""
        text = str(err)
        if "permissions violation" in text.lower():
            subject = text.rsplit(" ", 1)[-1].strip('"')
            if subject not in self.refused:
                self.refused.add(subject)
                log.error("NATS refused %s for %s/%s: %s; those events stay in the spool %s",
                          subject, self.run_id, self.producer, text, self.dir)
        else:
            log.debug("emitter: NATS error: %s", text)

    def _take(self) -> list[list[_Spooled]]:
        """The next messages' events: one event, or (with a backlog) up to MAX_BATCH_EVENTS queued
        events, one message per kind, in seq order within each."""
        if not self.batch:
            return [[self._pending.popleft()]]
        pending = self._pending  # emit appends on the right meanwhile; only this thread takes
        items = [pending.popleft() for _ in range(min(len(pending), MAX_BATCH_EVENTS))]
        # a message stays well under the server's payload limit: cut before the event that reaches MAX_BATCH_BYTES
        cut = max(1, bisect.bisect_left(list(itertools.accumulate(map(len, map(_DATA, items)))), MAX_BATCH_BYTES))
        if cut < len(items):
            pending.extendleft(reversed(items[cut:]))
            del items[cut:]
        if len(set(map(_KIND, items))) == 1:
            return [items]
        by_kind: dict[str, list[_Spooled]] = {}
        for item in items:
            by_kind.setdefault(item.kind, []).append(item)
        return list(by_kind.values())

    async def _publish_loop(self) -> None:
        nc, js = await self._connect()
        if nc is None:
            return
        inflight: dict[int, tuple[list[_Spooled], asyncio.Future, float]] = {}
        done: collections.deque[int] = collections.deque()
        last_sync = time.monotonic()
        try:
            while True:
                # send
                while self._pending and len(inflight) < MAX_INFLIGHT:
                    if not await self._send(js, self._take(), inflight, done):
                        await asyncio.sleep(0.1)
                        break
                # collect acknowledgements
                while done:
                    key = done.popleft()
                    entry = inflight.pop(key, None)
                    if entry is None:
                        continue
                    items, fut, _ = entry
                    if fut.cancelled() or fut.exception() is not None:
                        self._requeue(items)
                    else:
                        self._mark_acked(items)
                # resend what has waited too long (server restarted, message lost in flight)
                now = time.monotonic()
                for key in [k for k, (_, _, t) in inflight.items() if now - t > ACK_TIMEOUT_S]:
                    items, fut, _ = inflight.pop(key)
                    fut.cancel()
                    self._requeue(items)
                if now - last_sync > FSYNC_INTERVAL_S:
                    self._sync_outside_lock()
                    self._write_acked()
                    last_sync = now
                if self._closing.is_set() and (not inflight or not nc.is_connected):
                    if self._confirm_by is not None and not inflight:
                        await self._await_verdict(nc, js, self._confirm_by)
                    break
                if not self._pending and not inflight:  # idle: until emit wakes us
                    self._idle = True
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), 0.25)
                    except asyncio.TimeoutError:
                        pass
                    self._idle = False
                else:
                    # busy: let the connection write and read (PubAcks), then sleep with the loop stopped
                    # while events gather for the next message, so that no wake-up takes the GIL from
                    # emit (a thread woken 10k times a second doubled emit's CPU per event)
                    await asyncio.sleep(IO_SLICE_S)
                    if len(self._pending) < MAX_BATCH_EVENTS:
                        time.sleep(TICK_S)
        finally:
            try:
                await nc.close()
            except Exception:
                pass

    async def _await_verdict(self, nc, js, deadline: float) -> None:
        """Wait until the ledger has acked the stream up to its end as of now (so every event published
        before this close, ours and any clashing producer's, has been judged), collecting the seqs of
        this chain it found in conflict. Gives up quietly when no ledger answers or time runs out:
        JetStream holds the events either way, and `runledger verify` reports conflicts later."""
        try:
            target = (await js.stream_info(STREAM)).state.last_seq
        except Exception as err:
            log.debug("emitter: no stream info for the ledger's verdict (%s)", err)
            return
        while True:
            status = await ask_ledger(nc, self.run_id, self.producer)
            if status is None:
                log.info("emitter %s/%s: no ledger answered; its verdict on this chain comes later (verify)",
                         self.run_id, self.producer)
                return
            mine = status["chains"].get(str(self.attempt), {})
            self.conflicts.update(s for s in mine.get("conflicts", []) if s < self._seq)
            if status["ack_floor"] >= target:
                self.confirmed = True
                return
            if time.monotonic() > deadline:
                log.warning("emitter %s/%s: the ledger had not caught up with the stream by close()'s deadline",
                            self.run_id, self.producer)
                return
            await asyncio.sleep(CONFIRM_POLL_S)

    async def _send(self, js, messages: list[list[_Spooled]], inflight: dict, done: collections.deque) -> bool:
        """Publish each message (a single envelope, or a JSON array of one kind); False on failure."""
        for n, items in enumerate(messages):
            subject = subject_for(self.run_id, items[0].kind)
            if len(items) == 1:
                body, mid = items[0].data, bus.msg_id(items[0].event_id, items[0].hash)
            else:
                body = b"[" + b",".join(map(_DATA, items)) + b"]"
                mid = batch_msg_id(items)
            try:
                fut = await js.publish_async(subject, body, headers={"Nats-Msg-Id": mid})
            except Exception as err:
                log.debug("emitter: publish failed (%s); will retry", err)
                for rest in messages[n:]:
                    self._requeue(rest)
                return False
            key = self._next_key
            self._next_key += 1
            inflight[key] = (items, fut, time.monotonic())
            fut.add_done_callback(lambda _f, k=key: done.append(k))
        return True

    def _requeue(self, items: list[_Spooled]) -> None:
        """Put events back in the queue, keeping seq order (emit may be appending meanwhile)."""
        with self._lock:
            if self._pending and self._pending[0].seq < items[0].seq:
                merged = sorted([*self._pending, *items], key=lambda s: s.seq)
                self._pending.clear()
                self._pending.extend(merged)
            else:
                self._pending.extendleft(reversed(items))

    def _mark_acked(self, items: list[_Spooled]) -> None:
        seqs = list(map(_SEQ, items))
        with self._lock:  # emit adds to _unacked_bytes under the lock; take from it under the lock too
            if min(seqs) >= self._acked_upto and self._acked.isdisjoint(seqs):  # all new (the usual case)
                self._acked.update(seqs)
                self._unacked_bytes -= sum(map(len, map(_DATA, items)))
            else:  # some were acked before (a message sent again)
                for i in items:
                    if i.seq >= self._acked_upto and i.seq not in self._acked:
                        self._acked.add(i.seq)
                        self._unacked_bytes -= len(i.data)
        acked = self._acked
        if acked and min(acked) == self._acked_upto and max(acked) - self._acked_upto + 1 == len(acked):
            self._acked_upto += len(acked)  # a gapless run from the bound: move it in one step
            acked.clear()
        else:
            while self._acked_upto in acked:
                acked.discard(self._acked_upto)
                self._acked_upto += 1
        self.published += 1


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
