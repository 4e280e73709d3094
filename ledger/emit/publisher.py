"""The publisher of one chain: a background thread that sends its spool's events to JetStream and
records which were acknowledged.

The Nats-Msg-Id is the event_id with the event's hash (a batch: its first event_id, its length and its
last hash), so JetStream's dedupe drops only a resend of the same bytes: no one, of any role, can make
an event disappear by sending another message under its id first. NATS dedupes resends within its
window and the ledger dedupes by event_id after it, so the ledger stores each event once.

When events pile up (a fast producer, or NATS coming back), events of one kind are sent together
as one message: a JSON array on the same subject `runledger.{run_id}.{kind}`, each element still a
whole envelope with its own event_id (so subject permissions hold for batches too).

On stop, the publisher can wait for the ledger's verdict on the chain ({LEDGER_API}.chains...):
the seqs where the ledger found another producer's different event are its `conflicts`.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import itertools
import logging
import threading
import time
from typing import Callable

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.emit.chains import ask_ledger
from runledger.ledger.contract.events import STREAM, subject_for
from runledger.ledger.emit.spool import DATA, KIND, Spool, Spooled

log = logging.getLogger(__name__)

MAX_BATCH_EVENTS = 1_000  # events per NATS message when there is a backlog
MAX_BATCH_BYTES = 512 << 10
MAX_INFLIGHT = 256  # unacknowledged messages in flight
ACK_TIMEOUT_S = 5.0  # resend a message whose PubAck has not come by then
FSYNC_INTERVAL_S = 0.2
CONFIRM_POLL_S = 0.05  # stop(): how often to ask the ledger how far it has got
CONNECT_PROBE_S = 1.0  # (re)connecting: how long a TCP probe of the server may take
IO_SLICE_S = 0.001  # while busy: the event loop runs this long per round...
TICK_S = 0.01  # ...and the thread sleeps this long between rounds
IDLE_POLL_S = 0.01  # idle, it looks for new events this often: the producer never wakes it (a wake-up per
# event, a write to the loop's pipe, let this thread take the GIL in the middle of the producer's emit)


def batch_msg_id(items: list[Spooled]) -> str:
    """A batch's: its first event, its length and its last hash (which the chain ties to every entry)."""
    return f"{items[0].event_id}+{len(items)}:{items[-1].hash}"


class Publisher:
    """Publishes `spool`'s queue for the chain (run_id, producer, attempt) on its own thread."""

    def __init__(self, spool: Spool, run_id: str, producer: str, attempt: int, nats_url: str, batch: bool = True):
        self.spool, self.run_id, self.producer, self.attempt = spool, run_id, producer, attempt
        self.nats_url, self.batch = nats_url, batch
        self.closing = threading.Event()
        self.stopped = threading.Event()
        self.confirm_by: float | None = None  # stop(): wait for the ledger's verdict until then
        self.conflicts: set[int] = set()  # seqs of this chain where the ledger found a different event
        self.confirmed = False  # the ledger had processed everything published before stop()
        self.stored_upto = 0  # every seq of this chain below it is stored in the ledger's tables (known at stop())
        self.refused: set[str] = set()  # subjects the server refused us (see _on_error)
        self.published = 0  # messages acknowledged by JetStream (for progress and benches)
        self.connected_once = False  # it has reached the server (an offline run's finish waits only then)
        self.on_round: Callable[[], None] | None = None  # after each round's sealing (the Emitter's chain heads)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._next_key = 0
        self._thread = threading.Thread(target=self._thread_main, name=f"emitter-{run_id}-{producer}", daemon=True)

    def start(self) -> "Publisher":
        self._thread.start()
        return self


    def stop(self, confirm_by: float | None, join_s: float) -> None:
        """Finish what is in flight (and, until `confirm_by`, wait for the ledger's verdict), then stop."""
        self.confirm_by = confirm_by
        self.closing.set()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)
        self._thread.join(join_s)

    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._wake = asyncio.Event()
        try:
            loop.run_until_complete(self._publish_loop())
        except Exception:  # the thread must not die silently: the spool keeps the events
            log.exception("emitter publisher stopped")
        finally:
            self.stopped.set()
            loop.close()

    def url(self) -> str | None:
        """The server's URL: `nats_url`, or what it says when called (the root's local server, which may be
        starting: None until it is up)."""
        return self.nats_url() if callable(self.nats_url) else self.nats_url

    async def _connect(self):
        while not self.closing.is_set():
            nc = url = None
            self.spool.seal_accepted()  # (what `log` accepted is sealed meanwhile)
            if self.on_round is not None:
                self.on_round()
            try:  # (nats-py's first connect to a server that is not there tries again forever, deaf to stop())
                url = self.url()
                if url is None:
                    raise ConnectionRefusedError("the root's local server is starting")
                if not await bus.listening(url, CONNECT_PROBE_S):
                    raise ConnectionRefusedError(f"nothing listens at {url}")
                nc = await asyncio.wait_for(bus.connect(url, name=f"emitter-{self.producer}",
                                                        error_cb=self._on_error), CONNECT_PROBE_S * 5)
                js = nc.jetstream(publish_async_max_pending=MAX_INFLIGHT * 2)
                await bus.ensure_stream(js)
                self.connected_once = True
                return nc, js
            except Exception as err:  # server down, or no stream yet: keep the events spooled, try again
                log.debug("emitter: NATS not ready (%s)", err)
                if nc is not None:
                    await nc.close()
                try:  # (stop() wakes it at once)
                    await asyncio.wait_for(self._wake.wait(), 0.1 if url is None else 0.25)
                except asyncio.TimeoutError:
                    pass
        return None, None

    async def _on_error(self, err: Exception) -> None:
        """A publish the server refused (no permission) is reported; its events stay in the spool."""
        text = str(err)
        if "permissions violation" in text.lower():
            subject = text.rsplit(" ", 1)[-1].strip('"')
            if subject not in self.refused:
                self.refused.add(subject)
                log.error("NATS refused %s for %s/%s: %s; those events stay in the spool %s",
                          subject, self.run_id, self.producer, text, self.spool.dir)
        else:
            log.debug("emitter: NATS error: %s", text)

    def take(self) -> list[list[Spooled]]:
        """The next messages' events: one event, or (with a backlog) up to MAX_BATCH_EVENTS queued
        events, one message per kind, in seq order within each."""
        pending = self.spool.pending  # the producer appends on the right meanwhile; only this thread takes
        if not self.batch:
            return [[pending.popleft()]]
        items = [pending.popleft() for _ in range(min(len(pending), MAX_BATCH_EVENTS))]
        # a message stays well under the server's payload limit: cut before the event that reaches MAX_BATCH_BYTES
        cut = max(1, bisect.bisect_left(list(itertools.accumulate(map(len, map(DATA, items)))), MAX_BATCH_BYTES))
        if cut < len(items):
            pending.extendleft(reversed(items[cut:]))
            del items[cut:]
        if len(set(map(KIND, items))) == 1:
            return [items]
        by_kind: dict[str, list[Spooled]] = {}
        for item in items:
            by_kind.setdefault(item.kind, []).append(item)
        return list(by_kind.values())

    async def _publish_loop(self) -> None:
        nc, js = await self._connect()
        if nc is None:
            return
        spool = self.spool
        inflight: dict[int, tuple[list[Spooled], asyncio.Future, float]] = {}
        done: collections.deque[int] = collections.deque()
        last_sync = time.monotonic()
        try:
            while True:
                spool.seal_accepted()  # what `log` accepted since the last round (Spool.accept)
                if self.on_round is not None:
                    self.on_round()
                # send
                while spool.pending and len(inflight) < MAX_INFLIGHT:
                    if not await self._send(js, self.take(), inflight, done):
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
                        spool.requeue(items)
                    else:
                        spool.mark_acked(items)
                        self.published += 1
                # resend what has waited too long (server restarted, message lost in flight)
                now = time.monotonic()
                for key in [k for k, (_, _, t) in inflight.items() if now - t > ACK_TIMEOUT_S]:
                    items, fut, _ = inflight.pop(key)
                    fut.cancel()
                    spool.requeue(items)
                if now - last_sync > FSYNC_INTERVAL_S:
                    spool.sync()
                    spool.write_acked()
                    last_sync = now
                if self.closing.is_set() and (not inflight or not nc.is_connected):
                    if self.confirm_by is not None and not inflight:
                        await self._await_verdict(nc, js, self.confirm_by)
                    break
                if not spool.pending and not inflight:  # idle: look again in a moment (or at stop())
                    try:
                        await asyncio.wait_for(self._wake.wait(), IDLE_POLL_S)
                    except asyncio.TimeoutError:
                        pass
                else:
                    # busy: let the connection write and read (PubAcks), then sleep with the loop stopped
                    # while events gather for the next message, so that no wake-up takes the GIL from
                    # emit (a thread woken 10k times a second doubled emit's CPU per event)
                    await asyncio.sleep(IO_SLICE_S)
                    if len(spool.pending) < MAX_BATCH_EVENTS:
                        time.sleep(TICK_S)
        finally:
            try:
                await nc.close()
            except Exception:
                pass

    async def _await_verdict(self, nc, js, deadline: float) -> None:
        """Wait until the ledger has acked the stream up to its end as of now (so every event published
        before this stop, ours and any clashing producer's, has been judged), collecting the seqs of
        this chain it found in conflict. Gives up quietly when no ledger answers or time runs out:
        JetStream holds the events either way, and `runledger verify` reports conflicts later."""
        try:
            target = (await js.stream_info(STREAM)).state.last_seq
        except Exception as err:
            log.debug("emitter: no stream info for the ledger's verdict (%s)", err)
            return
        while True:
            status = await ask_ledger(nc, self.run_id, self.producer)
            if status is None and callable(self.nats_url) and time.monotonic() < deadline:
                await asyncio.sleep(CONFIRM_POLL_S)  # the root's own ledger, starting: it answers in a moment
                continue
            if status is None:
                log.info("emitter %s/%s: no ledger answered; its verdict on this chain comes later (verify)",
                         self.run_id, self.producer)
                return
            mine = status["chains"].get(str(self.attempt), {})
            self.conflicts.update(s for s in mine.get("conflicts", []) if s < self.spool.seq)
            if status["ack_floor"] >= target:
                self.confirmed = True
                self.stored_upto = int(mine.get("stored_upto", 0))
                return
            if time.monotonic() > deadline:
                log.warning("emitter %s/%s: the ledger had not caught up with the stream by close()'s deadline",
                            self.run_id, self.producer)
                return
            await asyncio.sleep(CONFIRM_POLL_S)

    async def _send(self, js, messages: list[list[Spooled]], inflight: dict, done: collections.deque) -> bool:
        """Publish each message (a single envelope, or a JSON array of one kind); False on failure."""
        for n, items in enumerate(messages):
            subject = subject_for(self.run_id, items[0].kind)
            if len(items) == 1:
                body, mid = items[0].data, bus.msg_id(items[0].event_id, items[0].hash)
            else:
                body = b"[" + b",".join(map(DATA, items)) + b"]"
                mid = batch_msg_id(items)
            try:
                fut = await js.publish_async(subject, body, headers={"Nats-Msg-Id": mid})
            except Exception as err:
                log.debug("emitter: publish failed (%s); will retry", err)
                for rest in messages[n:]:
                    self.spool.requeue(rest)
                return False
            key = self._next_key
            self._next_key += 1
            inflight[key] = (items, fut, time.monotonic())
            fut.add_done_callback(lambda _f, k=key: done.append(k))
        return True
