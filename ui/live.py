"""The dashboard's live feed: a NATS core subscription on `runledger.>` wakes it; it then waits until the
ledger has stored the stream up to the message that woke it, for that message's run (the ledger's
position, written after each commit; on a partitioned root, the position of the run's partition), moves
the read connection to the new snapshot and tells the pages' event streams, which push only what was
stored since they last pushed, up to the position. So a point reaches a page once it is in the ledger,
never before, and nothing is read again on a timer.
"""

from __future__ import annotations

import asyncio
import logging
import time

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.storage import stored
from runledger.ledger.contract.events import STREAM, SUBJECT_PREFIX

log = logging.getLogger(__name__)

POSITION_POLL_S = 0.01  # while waiting for the ledger to store what woke us: how often its position is read
STORED_WAIT_S = 5.0  # (as runledger.ledger.storage.stored.until_stored) ... for this long; then, the ledger being slow or down,
SLOW_POLL_S = 0.5  # ... this often, until it has stored it
RECONNECT_S = 5.0  # with NATS unreachable: how long before the next try
CONNECT_TIMEOUT_S = 2.0


class Feed:
    """Wakes on NATS messages, waits for the ledger to store them, refreshes `reader`, and bumps `version`."""

    def __init__(self, reader, nats_url: str | None):
        self.reader, self.url = reader, nats_url
        self.version = 0
        self.live = False
        self.reason = "not connected yet" if nats_url else "no NATS URL"
        self._changed = asyncio.Condition()
        self._task: asyncio.Task | None = None
        self.last_wake_s: float | None = None

    def status(self) -> dict:
        return {"live": self.live, "reason": self.reason, "position": self.reader.position, "version": self.version}

    async def start(self) -> None:
        # the runs page's rows and the health counts of its first page, worked out once now (from the
        # files' parts kept by an earlier start where there are some; the first visit then only adds what changed)
        self._primed = asyncio.create_task(asyncio.to_thread(self.reader.prime))
        if self.url:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if getattr(self, "_primed", None) is not None:
            try:
                await self._primed  # (a thread: it cannot be cancelled, and the connection must outlive it)
            except Exception as err:
                log.warning("summarising the runs failed: %s", err)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    async def wait_change(self, version: int, timeout: float) -> bool:
        """True once `version` is behind (something new was stored), False after `timeout`."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.version != version), timeout)
                return True
            except asyncio.TimeoutError:
                return False

    async def moved(self) -> None:
        """Refresh the reader if the ledger's position moved, and wake the pages."""
        if await asyncio.to_thread(self.reader.refresh):
            async with self._changed:
                self.version += 1
                self._changed.notify_all()

    async def _run(self) -> None:
        import nats

        while True:
            async def disconnected() -> None:
                self.live, self.reason = False, "NATS connection lost: reconnecting (no live updates meanwhile)"

            async def reconnected() -> None:
                self.live, self.reason = True, "live"
                await self.moved()  # what was stored while we were away

            try:  # (bounded: a server that is not there must be said so, not waited for)
                nc = await asyncio.wait_for(nats.connect(
                    self.url, name="runledger-ui", inbox_prefix=bus.inbox_for(self.url),
                    connect_timeout=CONNECT_TIMEOUT_S, max_reconnect_attempts=-1,
                    allow_reconnect=True, disconnected_cb=disconnected, reconnected_cb=reconnected), 2 * CONNECT_TIMEOUT_S)
            except Exception as err:
                self.live, self.reason = False, f"NATS unreachable ({type(err).__name__}): no live updates; reload to see new data"
                await asyncio.sleep(RECONNECT_S)
                continue
            try:
                await self._follow(nc)
            except asyncio.CancelledError:
                await nc.close()
                raise
            except Exception as err:  # a dropped connection: start over
                log.warning("live feed: %s", err)
                self.live, self.reason = False, f"NATS connection lost ({type(err).__name__})"
                try:
                    await nc.close()
                except Exception:
                    pass
                await asyncio.sleep(RECONNECT_S)

    async def _follow(self, nc) -> None:
        woken: set[str] = set()  # runs whose messages came since the last look
        wake = asyncio.Event()

        async def on_message(msg) -> None:
            parts = msg.subject.split(".")
            if len(parts) == 3:
                woken.add(parts[1])
            wake.set()

        await nc.subscribe("runledger.>", cb=on_message)
        js = nc.jetstream()
        self.live, self.reason = True, "live"
        await self.moved()  # whatever was stored while we were away
        awaited: dict[str, int] = {}  # run -> the stream seq the ledger is to store for it (of its partition, if any)
        since = time.monotonic()  # when the last message came
        while True:
            if not awaited:  # nothing awaited: sleep until a message comes
                await wake.wait()
            if wake.is_set():
                wake.clear()
                runs, since = set(woken), time.monotonic()
                woken.clear()
                self.last_wake_s = since
                for run in runs:
                    awaited[run] = max(awaited.get(run, 0), await self._last_seq(js, run))
            if stored.positions(self.reader.root) != self.reader.positions:
                await self.moved()  # each commit is pushed as soon as it is stored
            for run in [r for r, seq in awaited.items() if self.reader.position_of(r) >= seq]:
                del awaited[run]
            if awaited:  # (a ledger that is slow or down: asked less often)
                slow = time.monotonic() - since > STORED_WAIT_S
                try:
                    await asyncio.wait_for(wake.wait(), SLOW_POLL_S if slow else POSITION_POLL_S)
                except asyncio.TimeoutError:
                    pass

    async def _last_seq(self, js, run: str) -> int:
        """The stream seq of the run's last message (what woke us, or later): the seq the ledger, or the
        run's partition, has stored the run up to once its position reaches it."""
        try:
            return (await js.get_last_msg(STREAM, f"{SUBJECT_PREFIX}.{run}.>")).seq
        except Exception:  # a role that may not ask: the stream's last message (a single ledger's position
            try:  # reaches it), or else the run's position moving at all
                return (await js.stream_info(STREAM)).state.last_seq
            except Exception:
                return self.reader.position_of(run) + 1
