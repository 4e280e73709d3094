"""The JetStream side of the ledger: connecting, the RUNLEDGER stream, and durable pull consumers.

Whoever connects first creates (or updates) the stream with DESIGN.md's settings, so starting order
does not matter: file storage, nothing evicted silently (no max age, discard new when full), a
duplicate window of 2 minutes for publish-side dedupe by Nats-Msg-Id (`msg_id`: event_id and hash).
"""

from __future__ import annotations

import asyncio
import json
import logging

import nats
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError

from runledger.ledger import settings
from runledger.ledger.redact import redact
from runledger.ledger.contract.events import STREAM, SUBJECT_PREFIX
from runledger.ledger.bus.natsserver import MAX_PAYLOAD, inbox_prefix

log = logging.getLogger(__name__)

DEFAULT_URL = settings.env_nats_url()
DUPLICATE_WINDOW_S = 120.0  # DESIGN.md: duplicate window >= 2 min
ACK_WAIT_S = 30.0  # a consumer that has not acked in this time gets the message again
MAX_ACK_PENDING = 50_000


def stream_config(replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=STREAM,
        subjects=[f"{SUBJECT_PREFIX}.>"],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.NEW,
        max_age=0,
        max_msgs=-1,
        max_bytes=-1,
        max_msg_size=MAX_PAYLOAD,
        duplicate_window=DUPLICATE_WINDOW_S,
        num_replicas=replicas,
    )


def msg_id(event_id: str, event_hash: str) -> str:
    """The Nats-Msg-Id of one event: its id and its hash, so that JetStream's dedupe drops only a resend
    of the same event, never a different one sent first under its (predictable) id."""
    return f"{event_id}:{event_hash}"


async def connect(url: str = DEFAULT_URL, name: str = "runledger", **kw) -> nats.NATS:
    """A NATS connection that keeps reconnecting forever (a ledger outlives a server restart).

    `url` may list several servers separated by commas (a cluster) and may carry credentials
    (`nats://user:password@host:port`, as `runledger nats up --secure` writes them); replies then come
    to that user's own inbox (`inbox_for`), the only one a secure server lets it read.
    """
    servers = [u.strip() for u in url.split(",") if u.strip()]
    opts = dict(name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.25, connect_timeout=2,
                error_cb=_report_error, inbox_prefix=inbox_for(url))
    opts.update(kw)
    return await nats.connect(servers, **opts)


async def connect_listening(url: str, name: str = "runledger", probe_s: float = 1.0, **kw) -> nats.NATS:
    """`connect`, but ConnectionRefusedError at once when no server answers at `url` (`listening`): a caller
    that tries again in a loop stays able to stop (nats-py's first connect to no server never ends, even
    when cancelled)."""
    if not await listening(url, probe_s):
        raise ConnectionRefusedError(f"no NATS server answers at {redact(url)}")
    return await connect(url, name, **kw)


def inbox_for(url: str) -> str:
    """The inbox prefix of a connection to `url`: its user's (`natsserver.inbox_prefix`), from the
    credentials in the URL; `_INBOX` when it carries none."""
    from urllib.parse import urlsplit

    users = {urlsplit(u if "://" in u else f"nats://{u}").username for u in url.split(",") if u.strip()}
    if len(users) > 1:
        raise ValueError(f"the servers of {url.split('@')[-1]!r} name {len(users)} different users: give one user's URLs")
    return inbox_prefix(users.pop() if users else None)


async def listening(url: str, timeout: float = 1.0) -> bool:
    """Whether any server `url` lists answers as a NATS server does (its INFO line, sent on accepting a
    connection) within `timeout`: nats-py's first connect tries a server that refuses again and again
    until its caller's timeout, so a caller that must answer soon asks this first. (A port that accepts
    and says nothing, such as a proxy's or a blackholed address's, is no server.)"""
    from urllib.parse import urlsplit

    for u in (u.strip() for u in url.split(",") if u.strip()):
        parts = urlsplit(u if "://" in u else f"nats://{u}")
        writer = None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, parts.port or 4222), timeout)
            greeting = await asyncio.wait_for(reader.read(5), timeout)
        except (OSError, asyncio.TimeoutError, ValueError):
            continue
        finally:
            if writer is not None:
                writer.close()
        if greeting.upper().startswith(b"INFO"):
            return True
    return False


async def connect_when(url_of, stop: asyncio.Event, name: str, poll_s: float = 1.0, **kw) -> tuple[nats.NATS, str] | None:
    """(connection, url) to the server `url_of()` names (called again each `poll_s`: it may name none yet, or
    another once a root's embedded server came back on a new port), once one answers; None once `stop`
    is set first. Never stuck in a connect a stop cannot end (nats-py's first connect to a server that is
    not there tries again forever)."""
    said: object = ...  # (the first look is said, a root with no server yet included)
    while not stop.is_set():
        url = url_of()
        if url and await listening(url, poll_s):
            try:
                return await asyncio.wait_for(connect(url, name=name, **kw), 5 * poll_s + 5), url
            except Exception as err:  # (asyncio.TimeoutError too) it went away meanwhile: look again
                log.debug("connecting to %s: %s", url, err)
        elif url != said:
            log.info("%s: waiting for a server%s", name, f" at {redact(url)}" if url else "")
            said = url
        try:
            await asyncio.wait_for(stop.wait(), poll_s)
        except asyncio.TimeoutError:
            pass
    return None


async def close(nc: nats.NATS, url: str, timeout_s: float = 5.0) -> None:
    """Close a connection from `connect_when` within `timeout_s`: a server gone meanwhile leaves nothing
    to close cleanly, which is said at debug level, not raised."""
    try:
        await asyncio.wait_for(nc.close(), timeout_s)
    except Exception as err:  # (asyncio.TimeoutError too)
        log.debug("closing the connection to %s: %s", redact(url), err)


def run_aside(coro, timeout: float):
    """Run `coro` on its own event loop in a daemon thread and return its result, waiting at most
    `timeout` (TimeoutError). The caller may be inside an event loop of its own, Ctrl-C reaches it while
    it waits, and a thread still stuck in a connect never holds up the interpreter's exit."""
    import threading

    out: dict = {}

    def main() -> None:
        try:
            out["value"] = asyncio.run(coro)
        except BaseException as err:  # handed to the caller
            out["error"] = err

    t = threading.Thread(target=main, name="runledger-aside", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"no answer within {timeout:.0f}s")
    if "error" in out:
        raise out["error"]
    return out["value"]


def reachable(url: str, timeout: float = 3.0) -> bool:
    """Whether a server `url` lists accepts a TCP connection within `timeout` (each)."""
    try:
        return run_aside(listening(url, timeout), timeout * max(1, url.count(",") + 1) + 1.0)
    except TimeoutError:
        return False


async def _report_error(err: Exception) -> None:
    """What the server refuses (a permissions violation, say) is reported, never silently dropped."""
    text = str(err)
    if "permission" in text.lower() or "authorization" in text.lower():
        log.error("NATS refused: %s", text)
    else:
        log.debug("NATS error: %s", text)


_KEPT = ("subjects", "retention", "storage", "discard", "max_age", "max_msgs", "max_bytes", "duplicate_window")


async def ensure_stream(js: JetStreamContext, replicas: int | None = None) -> None:
    """Create the RUNLEDGER stream, or update it to these settings; safe to call from everyone.

    An existing stream with the right settings is left alone (its replica count included), so a
    producer with publish-only permissions needs only to read the stream's info.
    """
    try:
        info = await js.stream_info(STREAM)
    except NotFoundError:
        info = None
    if info is not None:
        want = stream_config(info.config.num_replicas or 1)
        if all(getattr(info.config, k) == getattr(want, k) for k in _KEPT) and replicas in (None, info.config.num_replicas):
            return
        log.info("updating stream %s to the ledger's settings", STREAM)
        await js.update_stream(stream_config(replicas or info.config.num_replicas or 1))
        return
    try:
        await js.add_stream(stream_config(replicas or 1))
    except BadRequestError:  # someone created it meanwhile
        pass


OWNER_KEY = "runledger_root_id"  # consumer metadata: the id of the ledger root that consumes with it


class ConsumerTaken(RuntimeError):
    """The durable consumer belongs to another ledger root, or its configuration or position does not
    match what the root has taken: consuming with it would split or skip events."""


def position_problem(info, seen_upto: int) -> str | None:
    """Why a consumer cannot be the one that fed a root that has taken stream seqs up to `seen_upto`
    (a consumer re-created by someone else with deliver_policy=new, say, or one someone else acked on);
    None if it can."""
    cfg = info.config
    deliver, ack = (getattr(v, "value", v) for v in (cfg.deliver_policy, cfg.ack_policy))  # (enum or its text)
    if deliver not in (DeliverPolicy.ALL.value, DeliverPolicy.BY_START_SEQUENCE.value):
        return f"delivers from {deliver!r}, not from the start of the stream"
    if cfg.filter_subject not in (None, "", f"{SUBJECT_PREFIX}.>") or cfg.filter_subjects:
        return f"takes only {cfg.filter_subject or cfg.filter_subjects}"
    if ack != AckPolicy.EXPLICIT.value:
        return f"has ack policy {ack!r}, not explicit"
    if deliver == DeliverPolicy.BY_START_SEQUENCE.value and (cfg.opt_start_seq or 1) - 1 > seen_upto:
        return f"starts at stream seq {cfg.opt_start_seq}, but this root has taken messages only up to {seen_upto}"
    if info.ack_floor.stream_seq > seen_upto:
        return (f"has acked up to stream seq {info.ack_floor.stream_seq}, but this root has taken messages only up to "
                f"{seen_upto}: someone else took them")
    return None


async def ensure_consumer(js: JetStreamContext, durable: str, filter_subject: str | None = None,
                          rewind: bool = False, owner: dict[str, str] | None = None, seen_upto: int | None = None) -> None:
    """A durable pull consumer with explicit acks that never gives up redelivering.

    With `rewind`, messages a dead predecessor left unacked are delivered again at once. With `owner`
    (metadata naming a ledger root, `OWNER_KEY` its id), the consumer is that root's: one that names
    another root raises ConsumerTaken, and one that names none is claimed. With `seen_upto` (the last
    stream seq the consumer's root has taken), a consumer whose configuration or position does not fit
    it raises ConsumerTaken too (see `position_problem`).
    """
    cfg = ConsumerConfig(
        durable_name=durable,
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ACK_WAIT_S,
        max_deliver=-1,
        max_ack_pending=MAX_ACK_PENDING,
        filter_subject=filter_subject or f"{SUBJECT_PREFIX}.>",
        metadata=owner,
    )
    try:
        info = await js.consumer_info(STREAM, durable)
    except NotFoundError:
        await js.add_consumer(STREAM, cfg)
        return
    if owner is not None:
        theirs = info.config.metadata or {}
        if theirs.get(OWNER_KEY) not in (None, owner[OWNER_KEY]):
            where = ", ".join(f"{k.removeprefix('runledger_')} {v}" for k, v in sorted(theirs.items()) if k != OWNER_KEY)
            raise ConsumerTaken(f"consumer {durable!r} belongs to another ledger root ({where}); give this root its own "
                                f"consumer with --durable NAME, or delete that one if its root is gone")
        problem = position_problem(info, seen_upto) if seen_upto is not None else None
        if problem:
            raise ConsumerTaken(f"consumer {durable!r} {problem}; refusing to start, as events would be skipped "
                                f"(restore the consumer, or start a fresh root)")
        if any(theirs.get(k) != v for k, v in owner.items()):
            log.info("consumer %s: claimed for this root", durable)
            info.config.metadata = {k: v for k, v in theirs.items() if not k.startswith("_nats")} | owner
            await js.add_consumer(STREAM, info.config)  # an update: metadata may change
    if rewind:
        # The sink is idempotent: messages acked out of order and delivered again are recognised and
        # acked once more.
        from runledger.ledger.bus.consumers import rewind_to_ack_floor

        cfg.metadata = owner or info.config.metadata
        await rewind_to_ack_floor(js, STREAM, durable, info, cfg)


PULL_MAX_BYTES = 32 << 20  # bytes one pull may bring: under nats-py's 64 MiB a subscription may hold


class PullError(RuntimeError):
    """The server answered a pull with an error status (the consumer was deleted, say)."""


class Puller:
    """Batches from a durable pull consumer, without nats-py's `fetch` cost per message.

    nats-py's `fetch` waits for each message with its own timer task; at one event per message that
    is most of the ledger's time. Here the messages land by a subscription callback in a list:
    `fetch(batch, timeout)` asks for what is waiting (a no_wait pull of up to `batch`) and, only if
    nothing is, waits up to `timeout` for the next message (a pull of one). A message that arrives
    for a pull given up on is kept for the next `fetch`; nothing is acked here. A pull brings at
    most PULL_MAX_BYTES: past nats-py's limit per subscription the rest would be dropped as a slow
    consumer's, and come again only after ack_wait (a 30 s stall, seen draining a 94 MB backlog).
    """

    def __init__(self, nc, stream: str, durable: str) -> None:
        self.nc = nc
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.inbox = nc.new_inbox()
        self._sub = None
        self._held: list = []  # messages delivered and not yet returned
        self._remaining = 0  # messages the current pull may still bring
        self._done = asyncio.Event()  # the current pull is answered: all of it, or a status
        self._status: tuple[str, str] | None = None

    async def start(self) -> "Puller":
        self._sub = await self.nc.subscribe(self.inbox, cb=self._on_message)
        return self

    async def _on_message(self, msg) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status is None:
            self._held.append(msg)
            self._remaining -= 1
            if self._remaining <= 0:
                self._done.set()
        elif status != "100":  # 404 no messages, 408 expired, 409 ...: this pull is over
            self._status = (status, msg.headers.get("Description", ""))
            self._done.set()

    async def _pull(self, request: dict, batch: int, wait_s: float) -> None:
        self._remaining, self._status = batch, None
        self._done.clear()
        await self.nc.publish(self.subject, json.dumps(request).encode(), reply=self.inbox)
        try:
            await asyncio.wait_for(self._done.wait(), wait_s)
        except asyncio.TimeoutError:
            pass
        ended = self._status is not None and (self._status[0] in ("404", "408") or "MaxBytes" in self._status[1])
        if self._status is not None and not ended:
            raise PullError(f"pull from {self.subject}: {self._status[0]} {self._status[1]}")

    async def fetch(self, batch: int, timeout: float) -> list:
        if not self._held:  # what is waiting now, up to `batch`
            await self._pull({"batch": batch, "no_wait": True, "max_bytes": PULL_MAX_BYTES}, batch, timeout)
        if not self._held:  # nothing was: wait for the next message
            await self._pull({"batch": 1, "expires": int(timeout * 1e9)}, 1, timeout + 0.1)  # its 408 first
        out, self._held = self._held[:batch], self._held[batch:]
        return out
