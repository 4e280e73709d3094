"""The dashboard's live feed: a NATS core subscription on `runledger.>` wakes it; it then waits until the
ledger has stored the stream up to the message that woke it, for that message's run (the ledger's
position, written after each commit; on a partitioned root, the position of the run's partition), moves
the read connection to the new snapshot and tells the pages' event streams, which push only what was
stored since they last pushed, up to the position. So a point reaches a page once it is in the ledger,
never before.

Which server: the one named (`--nats`, `--creds` or the environment), tried again while it does not
answer; else the root's own (`root_server`: the embedded default's, or `runledger nats up`'s),
looked up again at each (re)connect and each LOOK_S while none answers, so the feed finds a server that
starts after the dashboard and follows one that stops when idle and comes back on another port. Without a
server (or while it is away) the ledger's stored position is read each POLL_S (one small file): a run
whose ledger writes while no NATS reaches the dashboard still shows. One state is said at a time
(`status`): live via NATS, live by polling the tables, or not live and why.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.redact import redact
from runledger.ledger.storage import stored
from runledger.ledger.contract.events import STREAM, SUBJECT_PREFIX

log = logging.getLogger(__name__)

POSITION_POLL_S = 0.01  # while waiting for the ledger to store what woke us: how often its position is read
STORED_WAIT_S = 5.0  # (as runledger.ledger.storage.stored.until_stored) ... for this long; then, the ledger being slow or down,
SLOW_POLL_S = 0.5  # ... this often, until it has stored it
POLL_S = 1.0  # how often the ledger's stored position is read (what keeps a page live without NATS)
LOOK_S = 1.0  # how often the server is looked for (named again, asked whether it answers) while none is followed
REFUSED_S = 5.0  # a server that answers but refuses the connection: how long before it is asked again
CONNECT_TIMEOUT_S = 2.0
STOP_S = 5.0  # how long `stop` waits for the feed's tasks to end
NO_SERVER = "no NATS server runs for this root now (the next run's is found when it starts)"


def root_server(root) -> Callable[[], str | None]:
    """What a dashboard with no server named follows: a function naming the root's server now (the one its
    embedded default or `runledger nats up` started and recorded, `natsserver.running_url`, while that
    server's process lives), None while none runs: never nats://127.0.0.1:4222, which a root that never had
    a server does not use. (`server_of` in tools/args.py gives notify and the agents the same, with that default.)"""
    from runledger.ledger.bus import natsserver

    return lambda: natsserver.running_url(root)


class Feed:
    """Wakes on NATS messages (or, without them, on the ledger's position moving), waits for the ledger to
    store them, refreshes `reader`, and bumps `version`.

    `server`: a URL (the one named: tried again while it does not answer), a function naming the root's
    server at each call (None while none runs: followed across its stops and restarts), or None (no NATS:
    the tables are polled)."""

    def __init__(self, reader, server: str | Callable[[], str | None] | None):
        self.reader, self.server = reader, server
        self.version = 0
        self.url: str | None = None  # the server followed now (None: the tables are polled)
        self.why = "no NATS server given" if server is None else "looking for the NATS server"  # why not NATS
        self.poll_error: str | None = None  # why the ledger's position cannot be read (then nothing is live)
        self._changed = asyncio.Condition()
        self._tasks: list[asyncio.Task] = []
        self._stopping = False  # (a loop's own check: Python 3.11's wait_for may swallow a cancel)
        self._said: tuple | None = None  # the state the pages were last told (`_tell`)
        self.last_wake_s: float | None = None

    @property
    def live(self) -> bool:
        return self.url is not None or self.poll_error is None

    def status(self) -> dict:
        """One state: live via NATS ("via": "nats"), live by polling the tables ("tables"), or not live (None)."""
        if self.url is not None:
            via, reason = "nats", f"following the NATS server at {redact(self.url)}"
        elif self.poll_error is None:
            via, reason = "tables", self.why
        else:
            via, reason = None, self.poll_error
        return {"live": via is not None, "via": via, "reason": reason, "position": self.reader.position,
                "version": self.version}

    def _state(self) -> tuple:
        st = self.status()
        return st["via"], st["reason"]

    async def _tell(self) -> None:
        """Wake the pages' streams if the state changed (each stream is then sent the new status): a page's
        badge changes when the state does, once, and not on each look."""
        if self._state() != self._said:
            self._said = self._state()
            async with self._changed:
                self.version += 1
                self._changed.notify_all()

    def named(self) -> str | None:
        """The server to follow now (asked again each time: the root's moves)."""
        return self.server() if callable(self.server) else self.server

    async def start(self) -> None:
        # the runs page's rows and the health counts of its first page, worked out once now (from the
        # files' parts kept by an earlier start where there are some; the first visit then only adds what changed)
        self._primed = asyncio.create_task(asyncio.to_thread(self.reader.prime))
        if callable(self.server) and self.server() is None:
            self.why = NO_SERVER  # (said at once: the first page asks before the first look ends)
        self._said = self._state()
        self._tasks = [asyncio.create_task(self._poll())]
        if self.server is not None:
            self._tasks.append(asyncio.create_task(self._run()))

    async def stop(self) -> None:
        if getattr(self, "_primed", None) is not None:
            try:
                await self._primed  # (a thread: it cannot be cancelled, and the connection must outlive it)
            except Exception as err:
                log.warning("summarising the runs failed: %s", err)
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=STOP_S)

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

    async def _poll(self) -> None:
        """Each POLL_S: the ledger's stored position (a stat and a small read), and the pages woken if it moved.
        What keeps a page live while no NATS server is followed (and a net under one that is)."""
        while not self._stopping:
            try:
                moved = stored.positions(self.reader.root) != self.reader.positions
                self.poll_error = None
            except OSError as err:
                moved, self.poll_error = False, f"the ledger's position cannot be read: {err}"
            await self._tell()
            if moved:
                try:
                    await self.moved()
                except Exception as err:  # (a snapshot mid-write: the next poll takes it)
                    log.debug("refreshing the snapshot: %s", err)
            await asyncio.sleep(POLL_S)

    async def _run(self) -> None:
        """Connect to the server `named()` names once it answers; follow it until the connection is lost or
        the root's server moves; then look again (at once: a server that came back on another port is
        taken up without waiting)."""
        refused: tuple[str, float] | None = None  # (url, when): a server that answered and refused us
        while not self._stopping:
            url = self.named()
            if not url:
                self.why = NO_SERVER
            elif refused and refused[0] == url and time.monotonic() - refused[1] < REFUSED_S:
                pass
            elif not await bus.listening(url, CONNECT_TIMEOUT_S):  # (asked first: never stuck in a connect)
                self.why = f"nothing answers at {redact(url)}"
            else:
                lost = asyncio.Event()
                try:
                    nc = await self._connect(url, lost)
                except Exception as err:
                    refused = (url, time.monotonic())
                    self.why = f"the NATS server at {redact(url)} refused the connection: {_first_line(err)}"
                else:
                    refused, began = None, time.monotonic()
                    try:
                        await self._follow(nc, url, lost)
                    except asyncio.CancelledError:
                        raise
                    except Exception as err:  # a dropped connection: look again
                        log.warning("live feed: %s", _first_line(err))
                    finally:
                        self.url = None
                        await bus.close(nc, url)
                    if time.monotonic() - began >= LOOK_S:
                        continue  # (at once: the server may be back elsewhere)
                    self.why = f"the NATS server at {redact(url)} dropped the connection at once"  # (not asked again at once)
            await self._tell()
            await asyncio.sleep(LOOK_S)

    async def _connect(self, url: str, lost: asyncio.Event):
        """A connection to `url` that is not reconnected by nats-py (`_run` looks again: the root's server
        may have moved); `lost` is set once it closes."""
        import nats

        async def closed() -> None:
            lost.set()

        async def error(err: Exception) -> None:
            log.debug("live feed, %s: %s", redact(url), err)

        return await asyncio.wait_for(nats.connect(
            [u.strip() for u in url.split(",") if u.strip()], name="runledger-ui", inbox_prefix=bus.inbox_for(url),
            connect_timeout=CONNECT_TIMEOUT_S, allow_reconnect=False, max_reconnect_attempts=0,
            disconnected_cb=closed, closed_cb=closed, error_cb=error), 2 * CONNECT_TIMEOUT_S)

    async def _follow(self, nc, url: str, lost: asyncio.Event) -> None:
        """Until the connection is lost, or `named()` names another server (each LOOK_S)."""
        woken: set[str] = set()  # runs whose messages came since the last look
        wake = asyncio.Event()

        async def on_message(msg) -> None:
            parts = msg.subject.split(".")
            if len(parts) == 3:
                woken.add(parts[1])
            wake.set()

        async def on_lost() -> None:
            await lost.wait()
            wake.set()

        await nc.subscribe("runledger.>", cb=on_message)
        watch = asyncio.create_task(on_lost())
        try:
            js = nc.jetstream()
            self.url = url
            log.info("live updates from %s", redact(url))
            await self._tell()
            await self.moved()  # whatever was stored while we were away
            awaited: dict[str, int] = {}  # run -> the stream seq the ledger is to store for it (of its partition, if any)
            since = time.monotonic()  # when the last message came
            next_look = since + LOOK_S
            while not lost.is_set() and not self._stopping:
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
                if time.monotonic() >= next_look:  # the root's server moved (its old one may not have said so yet)
                    next_look = time.monotonic() + LOOK_S
                    if self.named() != url:
                        return
                slow = time.monotonic() - since > STORED_WAIT_S  # (a ledger that is slow or down: asked less often)
                try:
                    await asyncio.wait_for(wake.wait(), (SLOW_POLL_S if slow else POSITION_POLL_S) if awaited else LOOK_S)
                except asyncio.TimeoutError:
                    pass
        finally:
            watch.cancel()

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


def _first_line(err: Exception) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0] or type(err).__name__
