"""`runledger notify`: a durable JetStream consumer that delivers `alert` and `decision` events to webhooks, at least once.

One durable pull consumer of its own (`notify`, or `notify-{name}`), filtered to `runledger.*.alert` and
`runledger.*.decision`: the ledger's consumer is another, so a receiver that is down never slows the
ledger, and the stream keeps every event until notify has delivered it.

Each message is validated as the ledger validates it (`runledger.ledger.ingest.service.decode_message`: envelope, payload,
hash); what the ledger would refuse is logged and skipped, never delivered. Each valid event goes to
every route it matches (`runledger.interop.routes`), through that route's own queue and task: a route delivers its
events one at a time, in stream order, and retries a failure (an error status, a redirect, which is
never followed, no connection, a timeout: the route's timeout_s bounds a whole request, see
runledger.interop.webhook) with exponential backoff (capped, jittered) until the route's own URL takes it (2xx). A
message is acked only when every route it matched has delivered every event in it; until then notify keeps it
with in-progress acks (`msg.in_progress()`, every third of ack_wait), so JetStream neither redelivers
it nor counts it lost. Killed mid-delivery, notify starts again from the consumer's ack floor (it
rewinds the consumer, as the ledger does), so nothing is skipped; what a route had delivered but
not yet acked is sent again. Hence at least once: every request carries the event id as its
`Idempotency-Key` header and in its body, for the receiver to dedupe by.

A slow or dead route holds back only itself: the others keep delivering new events while its queue
grows, up to MAX_PENDING messages held unacked (the consumer's max_ack_pending); past that, fetching
waits until it catches up. For routes that must never wait on each other at all, run one notify per
route (`--name`), each with its own consumer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from runledger.interop import webhook
from runledger.interop.routes import KINDS, Route
from runledger.ledger.bus import jetstream as bus
from runledger.ledger.contract.events import STREAM, SUBJECT_PREFIX
from runledger.ledger.bus.natsserver import NOTIFY_DURABLE
from runledger.ledger.bus.consumers import rewind_to_ack_floor, stream_seq
from runledger.ledger.ingest.service import decode_message
from runledger.ledger.redact import redact

log = logging.getLogger(__name__)

DURABLE = NOTIFY_DURABLE  # the consumer's name; `notify-{name}` for one of several (the secure server allows `notify`)
ACK_WAIT_S = bus.ACK_WAIT_S  # the consumer's: a message not acked nor marked in progress by then comes again
IN_PROGRESS_SHARE = 1 / 3  # held messages are marked in progress every third of ack_wait (twice more before it)
MAX_PENDING = 10_000  # messages held unacked at most (= the consumer's max_ack_pending); alerts are rare
FETCH_BATCH = 500  # messages one pull may bring (each may be a batch of events)
POLL_S = 1.0  # how long one pull waits for news; also how soon a stop is seen
BACKOFF_BASE_S = 0.5  # the first retry's wait (before jitter); it doubles with each failure ...
BACKOFF_CAP_S = 60.0  # ... up to this: a receiver back after an outage is tried again within a minute
SENT_MEMORY = 100_000  # event ids each route remembers having delivered (a redelivered message skips them)
USER_AGENT = "runledger-notify"  # (so that a receiver's logs say who posted)


# ------------------------------------------------------------------------------------ payloads


def title(env: dict) -> str:
    """One line saying what happened: `[FAIL] run-7 grad_norm_high`, `[DECISION] run-7 set_dispatch`."""
    p = env["payload"]
    if env["kind"] == "alert":
        tag = "RESOLVED" if p.get("state") == "resolved" else p.get("severity", "warn").upper()
        return f"[{tag}] {env['run_id']}: {p['rule']}"
    mode = " (proposed)" if p.get("mode") == "proposed" else ""
    params = json.dumps(p.get("params") or {}, sort_keys=True)
    return f"[DECISION{mode}] {env['run_id']}: {p['action']} {params}"


def summary(env: dict) -> str:
    """The title and the message (an alert's) or rationale (a decision's), with who and at which step."""
    p = env["payload"]
    text = p["message"] if env["kind"] == "alert" else p["rationale"]
    step = "" if env["step"] is None else f", step {env['step']}"
    return f"{title(env)}: {text} ({p['agent']}{step})"


def _mrkdwn(text: str) -> str:
    """Slack's escaping of &, < and > (the only characters its mrkdwn text reserves)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(env: dict) -> dict:
    """A Slack incoming-webhook message: `text` (the fallback and notification line) and blocks."""
    p = env["payload"]
    text = p["message"] if env["kind"] == "alert" else p["rationale"]
    step = "-" if env["step"] is None else str(env["step"])
    return {
        "text": _mrkdwn(summary(env)),
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*{_mrkdwn(title(env))}*\n{_mrkdwn(text)}"}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": _mrkdwn(
                f"run `{env['run_id']}` · {p['agent']} · step {step} · {env['time']} · event `{env['event_id']}`")}]},
        ],
    }


def json_body(env: dict) -> dict:
    """The generic form: the envelope as stored, with a summary line and the idempotency key beside it."""
    return {"event_id": env["event_id"], "idempotency_key": env["event_id"], "kind": env["kind"],
            "run_id": env["run_id"], "summary": summary(env), "event": env}


def request_body(route: Route, env: dict) -> bytes:
    body = slack_body(env) if route.format == "slack" else json_body(env)
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def backoff_s(failures: int, rng: random.Random) -> float:
    """The wait after the `failures`-th failure in a row: BACKOFF_BASE_S doubling up to BACKOFF_CAP_S, of
    which a random half ("equal jitter"), so that restarted senders do not all come back at once."""
    full = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** min(failures - 1, 30))
    return full / 2 + rng.uniform(0, full / 2)


def request_headers(route: Route, event_id: str) -> dict[str, str]:
    return {"Content-Type": "application/json", "Idempotency-Key": event_id, "User-Agent": USER_AGENT, **route.headers}


def post(route: Route, body: bytes, event_id: str) -> int:
    """POST one event to the route's own URL, blocking (runledger.interop.webhook: within route.timeout_s in all, no
    redirect followed, its headers to its host only); returns the 2xx status, else raises NotDelivered."""
    return webhook.post(route.url, body, request_headers(route, event_id), route.timeout_s)


# ------------------------------------------------------------------------------------ delivery


@dataclass
class Held:
    """A message notify holds unacked: the deliveries (event × route) it still waits for."""

    msg: object
    seq: int
    left: int


@dataclass
class Counters:
    messages: int = 0
    events: int = 0
    invalid: int = 0
    delivered: int = 0
    skipped_known: int = 0
    failures: int = 0
    acked: int = 0
    by_route: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.__dict__.items())


class RouteSender:
    """One route's queue and the task that drains it, an event at a time, in order."""

    def __init__(self, route: Route, notifier: "Notifier", rng: random.Random) -> None:
        self.route, self.notifier, self.rng = route, notifier, rng
        self.queue: asyncio.Queue[tuple[dict, Held]] = asyncio.Queue()
        self.sent: OrderedDict[str, None] = OrderedDict()  # event ids delivered (the latest SENT_MEMORY)
        self.failing_since: float | None = None

    async def run(self) -> None:
        while True:
            env, held = await self.queue.get()
            eid = env["event_id"]
            if eid in self.sent:
                self.notifier.counters.skipped_known += 1
            else:
                await self.deliver(env)
                self.sent[eid] = None
                if len(self.sent) > SENT_MEMORY:
                    self.sent.popitem(last=False)
            await self.notifier.delivered(held)

    async def deliver(self, env: dict) -> None:
        body = request_body(self.route, env)
        failures = 0
        while True:
            try:
                await webhook.post_async(self.route.url, body, request_headers(self.route, env["event_id"]),
                                         self.route.timeout_s)
            except webhook.NotDelivered as err:
                failures += 1
                self.notifier.counters.failures += 1
                wait = backoff_s(failures, self.rng)
                if self.failing_since is None:
                    self.failing_since = time.monotonic()
                level = logging.WARNING if failures in (1, 5) or failures % 20 == 0 else logging.DEBUG
                log.log(level, "route %s: %s not delivered (%s, try %d); trying again in %.1fs (%d queued)",
                        self.route.name, env["event_id"], err, failures, wait, self.queue.qsize())
                await asyncio.sleep(wait)
                continue
            if self.failing_since is not None:
                log.info("route %s: delivering again after %.0fs of failures", self.route.name,
                         time.monotonic() - self.failing_since)
                self.failing_since = None
            c = self.notifier.counters
            c.delivered += 1
            c.by_route[self.route.name] = c.by_route.get(self.route.name, 0) + 1
            return


class Notifier:
    """The notify process's state: the routes' senders, the messages held unacked, the counters."""

    def __init__(self, routes: list[Route], seed: int | None = None, ack_wait_s: float = ACK_WAIT_S) -> None:
        rng = random.Random(seed)
        self.ack_wait_s = ack_wait_s
        self.senders = [RouteSender(r, self, rng) for r in routes]
        self.held: dict[int, Held] = {}  # stream seq -> message
        self.counters = Counters()

    async def take(self, msg) -> None:
        """Validate one message and queue its events on the routes they match (ack it now if none)."""
        seq = stream_seq(msg)
        if seq in self.held:  # delivered again (ack_wait passed): keep the newer handle, queue nothing twice
            self.held[seq].msg = msg
            return
        self.counters.messages += 1
        try:
            good, bad = decode_message(msg.subject, msg.data, seq)
        except Exception:  # a bug on some input must not stop delivery of the rest: said, and skipped
            log.exception("notify failed to read message %d (%s); skipping it", seq, msg.subject)
            good, bad = [], []
        for q in bad:
            self.counters.invalid += 1
            log.warning("skipping stream seq %d (%s): the ledger would refuse it: %s", seq, msg.subject, q.reason)
        held = Held(msg, seq, 0)
        work = []
        for env, _ in good:
            self.counters.events += 1
            for sender in self.senders:
                if sender.route.matches(env):
                    work.append((sender, env))
        held.left = len(work)
        if not work:
            await self._ack(held)
            return
        self.held[seq] = held
        for sender, env in work:
            sender.queue.put_nowait((env, held))

    async def delivered(self, held: Held) -> None:
        held.left -= 1
        if held.left == 0:
            self.held.pop(held.seq, None)
            await self._ack(held)

    async def _ack(self, held: Held) -> None:
        try:
            await held.msg.ack()
            self.counters.acked += 1
        except Exception as err:  # (the connection is down: the message comes again, and is recognised)
            log.warning("ack of stream seq %d failed: %s", held.seq, err)

    async def keep_in_progress(self, stop: asyncio.Event) -> None:
        """Every third of ack_wait, tell JetStream each held message is still being worked on. (It wakes at
        least every second: the consumer's ack_wait, learnt once notify is connected, may be shorter than
        the one it began with.)"""
        marked = time.monotonic()
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), min(self.ack_wait_s * IN_PROGRESS_SHARE, 1.0))
            except asyncio.TimeoutError:
                pass
            if time.monotonic() - marked < self.ack_wait_s * IN_PROGRESS_SHARE:
                continue
            marked = time.monotonic()
            for held in list(self.held.values()):
                try:
                    await held.msg.in_progress()
                except Exception as err:
                    log.debug("in-progress ack of %d failed: %s", held.seq, err)


def consumer_config(durable: str, start: DeliverPolicy, opt_start_seq: int | None = None,
                    ack_wait_s: float = ACK_WAIT_S) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=durable, deliver_policy=start, opt_start_seq=opt_start_seq, ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait_s, max_deliver=-1, max_ack_pending=MAX_PENDING,
        filter_subjects=[f"{SUBJECT_PREFIX}.*.{k}" for k in KINDS],
    )


async def ensure_consumer(js, durable: str, from_start: bool, ack_wait_s: float = ACK_WAIT_S) -> float:
    """Create notify's consumer (from the stream's start with `from_start`, else from new events), or, if
    a previous notify died holding unacked messages, rewind it to just past its ack floor so that they
    come again at once (the receivers dedupe what had been delivered). Returns its ack_wait in seconds."""
    try:
        info = await js.consumer_info(STREAM, durable)
    except NotFoundError:
        start = DeliverPolicy.ALL if from_start else DeliverPolicy.NEW
        await js.add_consumer(STREAM, consumer_config(durable, start, ack_wait_s=ack_wait_s))
        log.info("consumer %s created: delivering %s", durable, "every recorded event" if from_start else "new events")
        return ack_wait_s
    ack_wait_s = info.config.ack_wait or ack_wait_s  # an existing consumer's own
    await rewind_to_ack_floor(js, STREAM, durable, info, consumer_config(durable, DeliverPolicy.BY_START_SEQUENCE,
                                                                         ack_wait_s=ack_wait_s))
    return ack_wait_s


async def serve(routes: list[Route], nats_url: str | Callable[[], str | None], durable: str = DURABLE,
                from_start: bool = False, stop: asyncio.Event | None = None, ready: asyncio.Event | None = None,
                poll_s: float = POLL_S, report_every_s: float = 60.0, ack_wait_s: float = ACK_WAIT_S) -> Counters:
    """Deliver until `stop` (set by SIGTERM/SIGINT in the CLI). What is not delivered by then stays unacked
    and comes again at the next start. `ready` is set once the consumer exists; `ack_wait_s` is a new
    consumer's ack_wait (held messages are marked in progress every third of it).

    `nats_url` may be a function naming the server each time it is called (None: none now): notify
    waits for one, and once it names another (a root's embedded server stopped when idle and came back
    on a new port) it lets the old connection go and takes up its consumer on the new server, where
    the same JetStream store holds it. The routes' queues and the messages held go on across the move."""
    stop = stop or asyncio.Event()
    url_of = nats_url if callable(nats_url) else (lambda: nats_url)
    notifier = Notifier(routes, ack_wait_s=ack_wait_s)
    tasks = [asyncio.create_task(s.run(), name=f"route-{s.route.name}") for s in notifier.senders]
    tasks.append(asyncio.create_task(notifier.keep_in_progress(stop)))
    try:
        while not stop.is_set():
            got = await bus.connect_when(url_of, stop, durable, poll_s)
            if got is None:
                break
            nc, url = got
            try:
                await _consume(nc, url, url_of, notifier, tasks, durable, from_start, stop, ready, poll_s,
                               report_every_s, ack_wait_s)
            finally:
                await bus.close(nc, url)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        log.info("notify stopped: %s; %d messages left unacked for next time", notifier.counters.line(),
                 len(notifier.held))
    return notifier.counters


async def _consume(nc, url: str, url_of, notifier: Notifier, tasks: list, durable: str, from_start: bool,
                   stop: asyncio.Event, ready: asyncio.Event | None, poll_s: float, report_every_s: float,
                   ack_wait_s: float) -> None:
    """Deliver from one connection until `stop`, or until `url_of()` names another server."""
    js = nc.jetstream()
    await bus.ensure_stream(js)
    notifier.ack_wait_s = await ensure_consumer(js, durable, from_start, ack_wait_s)
    puller = await bus.Puller(nc, STREAM, durable).start()
    if ready is not None:
        ready.set()
    log.info("notify: consumer %s at %s, routes %s", durable, redact(url),
             ", ".join(f"{s.route.name} ({s.route.format})" for s in notifier.senders))
    reported = time.monotonic()
    while not stop.is_set():
        if (now := url_of()) != url:
            log.info("notify: the server moved from %s to %s: following it", redact(url), redact(now) if now else "none yet")
            return
        room = MAX_PENDING - len(notifier.held)
        if room <= 0:  # the slowest route is MAX_PENDING messages behind: let it catch up
            await asyncio.sleep(poll_s)
            continue
        try:
            msgs = await puller.fetch(min(FETCH_BATCH, room), timeout=poll_s)
        except bus.PullError as err:
            log.warning("%s", err)
            await asyncio.sleep(poll_s)
            continue
        for m in msgs:
            await notifier.take(m)
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception():  # a sender's bug: stop loudly, nothing acked
                raise t.exception()
        if time.monotonic() - reported > report_every_s:
            reported = time.monotonic()
            log.info("notify: %s; held %d", notifier.counters.line(), len(notifier.held))
