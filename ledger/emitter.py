"""The producer side: `Emitter.emit()` seals an event, appends it to a local spool and returns at once.

A background thread publishes spooled events to JetStream (Nats-Msg-Id = event_id) and records
which were acknowledged. The spool is the outbox: an event that `emit` accepted is in the spool file
(written before `emit` returns, fsync'd in batches), so if NATS is slow or down, or this process dies,
it is published again later — by this Emitter's retries, or by the next Emitter opened on the same
spool. NATS dedupes resends within its window and the ledger dedupes by event_id after it, so the
ledger stores each event once. Past `max_spool_bytes` of unacknowledged events `emit` raises
`SpoolFull`; nothing is ever dropped.

When events pile up (a fast producer, or NATS coming back), events of one kind are sent together
as one message: a JSON array on the same subject `runledger.{run_id}.{kind}`, each element still a
whole envelope with its own event_id (so subject permissions hold for batches too).

Spool layout: {spool_dir}/{run_id}/{producer}/{attempt}/seg-{first_seq}.jsonl (one canonical
envelope per line) and `acked` (every seq below this number is acknowledged).
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
import threading
import time
from pathlib import Path
from typing import NamedTuple

from ledger import bus
from ledger.events import seal, seal_many, subject_for
from ledger.store import fsync_dir

log = logging.getLogger(__name__)

SEGMENT_EVENTS = 20_000  # events per spool segment file
MAX_BATCH_EVENTS = 1_000  # events per NATS message when there is a backlog
MAX_BATCH_BYTES = 512 << 10
MAX_INFLIGHT = 256  # unacknowledged messages in flight
ACK_TIMEOUT_S = 5.0  # resend a message whose PubAck has not come by then
FSYNC_INTERVAL_S = 0.2
IO_SLICE_S = 0.001  # while busy: the event loop runs this long per round...
TICK_S = 0.01  # ...and the thread sleeps this long between rounds


class SpoolFull(RuntimeError):
    """More unacknowledged events than the spool may hold; the event was not accepted."""


class _Spooled(NamedTuple):  # (a tuple: emit_many makes many, and a tuple is made fastest)
    seq: int
    kind: str
    event_id: str
    data: bytes  # canonical envelope text, no newline


_SEQ, _KIND, _DATA = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(3)  # a _Spooled's fields, fast


class Emitter:
    """Emit events for one (run_id, producer, attempt) chain; see the module docstring."""

    def __init__(
        self, run_id: str, producer: str, attempt: int = 0, nats_url: str = bus.DEFAULT_URL,
        spool_dir: str | Path = "./runledger-data/spool", max_spool_bytes: int = 512 << 20,
        batch: bool = True,
    ) -> None:
        self.run_id, self.producer, self.attempt = run_id, producer, attempt
        self.nats_url = nats_url
        self.max_spool_bytes = max_spool_bytes
        self.batch = batch
        self.dir = Path(spool_dir) / run_id / producer / str(attempt)
        self.dir.mkdir(parents=True, exist_ok=True)
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
        self._pending.extend(map(_Spooled, range(self._seq, self._seq + n), [kind] * n, ids, texts))
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
        """Flush (up to `timeout`), then stop; unacknowledged events stay in the spool for next time."""
        ok = self.flush(timeout)
        self._closing.set()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)
        self._thread.join(10)
        with self._lock:
            self._sync_segment()
            if self._seg_fd is not None:
                os.close(self._seg_fd)
                self._seg_fd = None
        self._write_acked()
        if not ok:
            log.warning("emitter %s/%s closed with %d events unacknowledged (kept in %s)",
                        self.run_id, self.producer, self._seq - self._acked_upto, self.dir)
        return ok

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
                    self._pending.append(_Spooled(env["seq"], env["kind"], env["event_id"], line))
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

    async def _send(self, js, messages: list[list[_Spooled]], inflight: dict, done: collections.deque) -> bool:
        """Publish each message (a single envelope, or a JSON array of one kind); False on failure."""
        for n, items in enumerate(messages):
            subject = subject_for(self.run_id, items[0].kind)
            if len(items) == 1:
                body, msg_id = items[0].data, items[0].event_id
            else:
                body = b"[" + b",".join(map(_DATA, items)) + b"]"
                msg_id = f"{items[0].event_id}+{len(items)}:{items[-1].seq}"
            try:
                fut = await js.publish_async(subject, body, headers={"Nats-Msg-Id": msg_id})
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
