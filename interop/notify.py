"""`runledger notify`: a durable JetStream consumer that delivers `alert` and `decision` events to webhooks, at least once, and pages.

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

A route with paging rules (cooldown, digest, repeat until acknowledged: runledger.interop.paging) sends
what its Pager says when it says it, and holds a page's message unacked until an `alert_ack` event (which
the consumer then takes too) or the alert's resolution, a digest's until the digest is delivered: the
unacked messages are the state a SIGKILLed notify gets back. Such a consumer is not rewound at start (what
followed a page held for hours, sent long since, would all go again): JetStream gives back the unacked
ones after its ack_wait. Bodies: Slack, JSON, ntfy (the text; title, priority and tags in headers),
Pushover (its message API, with the route's `params`: token and user).

A slow or dead route holds back only itself: the others keep delivering new events while its queue
grows, up to MAX_PENDING messages held unacked (the consumer's max_ack_pending); past that, fetching
waits until it catches up. For routes that must never wait on each other at all, run one notify per
route (`--name`), each with its own consumer.
"""

from __future__ import annotations

import asyncio
import base64
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
from runledger.interop.paging import PAGE_SEVERITY, Out, Pager, rank
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


NTFY_PRIORITY = {"fail": "5", "warn": "4", "info": "3"}  # ntfy's urgent, high, default (a decision: default)
PUSHOVER_PRIORITY = {"fail": 1, "warn": 0, "info": -1}  # Pushover's high, normal, low (notify repeats pages itself)
PUSHOVER_TITLE, PUSHOVER_MESSAGE = 250, 1024  # Pushover's limits, in characters


def _label(out: Out) -> str:
    return f"[REPEAT {out.repeat}] " if out.repeat else ""


def _severity(out: Out) -> str:
    """The highest severity among an out's alerts ("" for decisions only)."""
    sev = [e["payload"].get("severity", "warn") for e in out.envs if e["kind"] == "alert"]
    return max(sev, key=rank) if sev else ""


def digest_title(route: Route, out: Out) -> str:
    return f"[DIGEST] {len(out.envs)} alert{'s' if len(out.envs) != 1 else ''} ({route.name})"


def out_text(route: Route, out: Out) -> tuple[str, str]:
    """(title, text) of an out in plain words: an event's title and summary, or a digest's line per event."""
    if out.digest:
        return digest_title(route, out), "\n".join(summary(e) for e in out.envs)
    env = out.envs[0]
    return _label(out) + title(env), _label(out) + summary(env)


def _ascii_header(text: str) -> str:
    """A header value ntfy reads: the text on one line, RFC 2047-encoded (UTF-8, base64) if not ASCII."""
    text = " ".join(text.split())
    if text.isascii():
        return text
    return "=?UTF-8?B?" + base64.b64encode(text.encode()).decode() + "?="


def request_body(route: Route, env_or_out: dict | Out) -> bytes:
    """The body of one request in the route's format (an event, or an Out: a repeat or a digest)."""
    out = env_or_out if isinstance(env_or_out, Out) else Out(env_or_out["event_id"], [env_or_out])
    if route.format == "ntfy":
        return out_text(route, out)[1].encode()
    if route.format == "pushover":
        head, text = out_text(route, out)
        sev = _severity(out)
        body = {**route.params, "title": head[:PUSHOVER_TITLE], "message": text[:PUSHOVER_MESSAGE],
                "priority": PUSHOVER_PRIORITY.get(sev, 0)}
    elif out.digest:
        head, text = out_text(route, out)
        if route.format == "slack":
            body = {"text": _mrkdwn(head), "blocks": [
                {"type": "section", "text": {"type": "mrkdwn", "text": f"*{_mrkdwn(head)}*\n{_mrkdwn(text)}"}},
                {"type": "context", "elements": [{"type": "mrkdwn", "text": _mrkdwn(f"digest `{out.key}`")}]}]}
        else:
            body = {"event_id": out.key, "idempotency_key": out.key, "kind": "digest", "summary": head,
                    "events": [json_body(e) for e in out.envs]}
    elif route.format == "slack":
        body = slack_body(out.envs[0])
        if out.repeat:
            body["text"] = _mrkdwn(_label(out)) + body["text"]
            body["blocks"][1]["elements"][0]["text"] += f" · repeat {out.repeat} `{out.key}`"
    else:
        body = json_body(out.envs[0])
        if out.repeat:
            body.update(idempotency_key=out.key, repeat=out.repeat, summary=_label(out) + body["summary"])
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def backoff_s(failures: int, rng: random.Random) -> float:
    """The wait after the `failures`-th failure in a row: BACKOFF_BASE_S doubling up to BACKOFF_CAP_S, of
    which a random half ("equal jitter"), so that restarted senders do not all come back at once."""
    full = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** min(failures - 1, 30))
    return full / 2 + rng.uniform(0, full / 2)


def request_headers(route: Route, event_id: str, out: Out | None = None) -> dict[str, str]:
    """The headers of one request: its Idempotency-Key (the event id, a repeat's or a digest's key), and for
    ntfy the title, priority and tags it shows."""
    if route.format != "ntfy":
        return {"Content-Type": "application/json", "Idempotency-Key": event_id, "User-Agent": USER_AGENT,
                **route.headers}
    sev = _severity(out) if out is not None else ""
    head = out_text(route, out)[0] if out is not None else event_id
    tags = ",".join(t for t in ("rotating_light" if sev == PAGE_SEVERITY else sev, "digest" if out and out.digest
                                else "", f"repeat-{out.repeat}" if out and out.repeat else "") if t)
    return {"Content-Type": "text/plain; charset=utf-8", "Idempotency-Key": event_id, "User-Agent": USER_AGENT,
            "Title": _ascii_header(head)[:1000], "Priority": NTFY_PRIORITY.get(sev, "3"),
            **({"Tags": tags} if tags else {}), **route.headers}


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
    """One route's queue and the task that drains it, an event at a time, in order; a route with paging
    rules (runledger.interop.paging) sends what its Pager says, when it says."""

    def __init__(self, route: Route, notifier: "Notifier", rng: random.Random) -> None:
        self.route, self.notifier, self.rng = route, notifier, rng
        self.queue: asyncio.Queue[tuple[dict, Held]] = asyncio.Queue()
        self.sent: OrderedDict[str, None] = OrderedDict()  # event ids delivered (the latest SENT_MEMORY)
        self.failing_since: float | None = None
        self.pager = Pager(route, notifier.ack_wait_s) if route.pages else None

    async def run(self) -> None:
        getter: asyncio.Future | None = None
        try:
            while True:
                getter = getter or asyncio.ensure_future(self.queue.get())
                wait = None
                if self.pager is not None and (at := self.pager.next_due()) is not None:
                    wait = max(0.0, at - time.monotonic())
                done, _ = await asyncio.wait({getter}, timeout=wait)
                outs, released = [], []
                if done:
                    env, held = getter.result()
                    getter = None
                    if self.pager is None:
                        outs = [Out(env["event_id"], [env], releases=[held])]
                    else:
                        self.pager.ack_wait_s = self.notifier.ack_wait_s
                        outs, released = self.pager.take(env, held, time.monotonic())
                if self.pager is not None:
                    more, freed = self.pager.due(time.monotonic())
                    outs, released = outs + more, released + freed
                for out in outs:
                    if out.key in self.sent:
                        self.notifier.counters.skipped_known += 1
                    else:
                        await self.deliver(out)
                        self.sent[out.key] = None
                        if len(self.sent) > SENT_MEMORY:
                            self.sent.popitem(last=False)
                    for held in out.releases:
                        await self.notifier.delivered(held)
                for held in released:
                    await self.notifier.delivered(held)
        finally:
            if getter is not None:
                getter.cancel()

    async def deliver(self, out: Out | dict) -> None:
        out = out if isinstance(out, Out) else Out(out["event_id"], [out])
        body = request_body(self.route, out)
        headers = request_headers(self.route, out.key, out)
        failures = 0
        while True:
            try:
                await webhook.post_async(self.route.url, body, headers, self.route.timeout_s)
            except webhook.NotDelivered as err:
                failures += 1
                self.notifier.counters.failures += 1
                wait = backoff_s(failures, self.rng)
                if self.failing_since is None:
                    self.failing_since = time.monotonic()
                level = logging.WARNING if failures in (1, 5) or failures % 20 == 0 else logging.DEBUG
                log.log(level, "route %s: %s not delivered (%s, try %d); trying again in %.1fs (%d queued)",
                        self.route.name, out.key, err, failures, wait, self.queue.qsize())
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
        self.ack_wait_s = ack_wait_s  # (before the senders: a pager's acknowledgement grace is counted in it)
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
                if sender.route.matches(env) if env["kind"] != "alert_ack" else sender.route.repeat_every_s:
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


ACK_KIND = "alert_ack"  # what a consumer for pages also takes: the acknowledgements that stop them


def consumer_config(durable: str, start: DeliverPolicy, opt_start_seq: int | None = None,
                    ack_wait_s: float = ACK_WAIT_S, acks: bool = False) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=durable, deliver_policy=start, opt_start_seq=opt_start_seq, ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait_s, max_deliver=-1, max_ack_pending=MAX_PENDING,
        filter_subjects=[f"{SUBJECT_PREFIX}.*.{k}" for k in (*KINDS, *((ACK_KIND,) if acks else ()))],
    )


async def ensure_consumer(js, durable: str, from_start: bool, ack_wait_s: float = ACK_WAIT_S, acks: bool = False,
                          holds: bool = False) -> float:
    """Create notify's consumer (from the stream's start with `from_start`, else from new events), or, if
    a previous notify died holding unacked messages, rewind it to just past its ack floor so that they
    come again at once (the receivers dedupe what had been delivered). Returns its ack_wait in seconds.

    `acks`: it takes `alert_ack` events too (a route repeats pages until acknowledged); an existing
    consumer's subjects are brought to what this notify takes. `holds`: a route holds messages for long
    (pages until acknowledged, digests): then it is not rewound, since everything after its ack floor, sent
    long since, would go again; JetStream itself gives back only the unacked ones, after its ack_wait."""
    try:
        info = await js.consumer_info(STREAM, durable)
    except NotFoundError:
        start = DeliverPolicy.ALL if from_start else DeliverPolicy.NEW
        await js.add_consumer(STREAM, consumer_config(durable, start, ack_wait_s=ack_wait_s, acks=acks))
        log.info("consumer %s created: delivering %s", durable, "every recorded event" if from_start else "new events")
        return ack_wait_s
    ack_wait_s = info.config.ack_wait or ack_wait_s  # an existing consumer's own
    wanted = consumer_config(durable, info.config.deliver_policy, info.config.opt_start_seq, ack_wait_s, acks)
    if sorted(info.config.filter_subjects or [info.config.filter_subject or ""]) != sorted(wanted.filter_subjects):
        cfg = info.config
        cfg.filter_subjects, cfg.filter_subject = wanted.filter_subjects, None
        await js.add_consumer(STREAM, cfg)  # (create or update: the same consumer, its subjects changed)
        log.info("consumer %s now takes %s", durable, ", ".join(wanted.filter_subjects))
    if holds:
        if info.num_ack_pending:
            log.info("consumer %s has %d unacked messages (pages, digests): JetStream gives them again within %gs",
                     durable, info.num_ack_pending, ack_wait_s)
        return ack_wait_s
    await rewind_to_ack_floor(js, STREAM, durable, info, consumer_config(durable, DeliverPolicy.BY_START_SEQUENCE,
                                                                         ack_wait_s=ack_wait_s, acks=acks))
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
    notifier.ack_wait_s = await ensure_consumer(
        js, durable, from_start, ack_wait_s, acks=any(s.route.repeat_every_s for s in notifier.senders),
        holds=any(s.route.repeat_every_s or s.route.digest_every_s for s in notifier.senders))
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
