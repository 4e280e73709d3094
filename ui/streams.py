"""The dashboard's open live streams (`/api/live`): at most MAX_STREAMS at a time, and one read per wake per
run, shared by every stream that watches the run.

When the feed (runledger.ui.live.Feed) says something new was stored, one task reads each watched run's new
points once (`Reader.new_points` from where that run's last read stopped) and hands them to the streams
watching it, then tells every stream the new status. A stream opened with `since` (the seq its page was
drawn up to) first gets what was stored between that and where the shared reads are, read once for it.
A stream that does not take its events (a reader that stopped reading) is closed; its page reconnects.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)

MAX_STREAMS = 32  # open streams at a time (a page holds one); more are refused (429)
QUEUED = 256  # events a stream may have waiting before it is closed as stuck
WAKE_TIMEOUT_S = 15.0  # how often the shared reader looks whether any stream is left


class Full(RuntimeError):
    """MAX_STREAMS streams are open."""


class Subscription:
    """One open stream: its events, in order (`next`), and its run's catch-up from `since`."""

    def __init__(self, streams: Streams, run: str | None, since: int, upto: int):
        self.streams, self.run, self.closed = streams, run, False
        self.queue: asyncio.Queue = asyncio.Queue(QUEUED)
        self.catch_up = (since, upto) if run is not None and since and since < upto else None

    def put(self, event: str, data: dict) -> None:
        try:
            self.queue.put_nowait({"event": event, "data": data})
        except asyncio.QueueFull:
            log.warning("a live stream that does not read its events is closed")
            self.close()

    async def next(self, timeout: float) -> dict | None:
        """The next event, or None after `timeout` (or once closed)."""
        if self.catch_up is not None:
            since, upto = self.catch_up
            self.catch_up = None
            news = await asyncio.to_thread(self.streams.reader.new_points, self.run, since, upto)
            if news.get("kinds"):
                return {"event": "points", "data": news}
        if self.closed and self.queue.empty():
            return None
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except asyncio.TimeoutError:
            return None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.streams.release(self)


class Streams:
    """The open streams over one reader and feed (see the module docstring)."""

    def __init__(self, reader, feed, limit: int = MAX_STREAMS):
        self.reader, self.feed, self.limit = reader, feed, limit
        self.subs: list[Subscription] = []
        self.seqs: dict[str, int] = {}  # watched run -> where the shared reads of its points stopped
        self._task: asyncio.Task | None = None

    @property
    def open_count(self) -> int:
        return len(self.subs)

    def open(self, run: str | None, since: int = 0) -> Subscription:
        """A new stream (of `run`'s points too, from `since`); raises Full at the limit."""
        if len(self.subs) >= self.limit:
            raise Full(f"{self.limit} live streams are open: close a page, or try again later")
        if run is not None and run not in self.seqs:
            self.seqs[run] = self.reader.position_of(run)
        sub = Subscription(self, run, since, self.seqs.get(run, 0))
        sub.put("status", self.feed.status())
        self.subs.append(sub)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._pump())
        return sub

    def release(self, sub: Subscription) -> None:
        if sub in self.subs:
            self.subs.remove(sub)
        if sub.run is not None and not any(s.run == sub.run for s in self.subs):
            self.seqs.pop(sub.run, None)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    async def _pump(self) -> None:
        version = self.feed.version
        while self.subs:
            if not await self.feed.wait_change(version, WAKE_TIMEOUT_S):
                continue
            version = self.feed.version
            for run in list(self.seqs):
                try:
                    news = await asyncio.to_thread(self.reader.new_points, run, self.seqs[run])
                except Exception as err:  # (a file compacted away meanwhile, say: the next wake reads it again)
                    log.warning("live points of %s: %s", run, str(err).splitlines()[0] if str(err) else type(err).__name__)
                    continue
                if run not in self.seqs:  # its last stream closed meanwhile
                    continue
                self.seqs[run] = news["seq"]
                if news.get("kinds"):
                    for sub in [s for s in self.subs if s.run == run]:
                        sub.put("points", news)
            status = self.feed.status()
            for sub in list(self.subs):
                sub.put("stored", status)
