"""One route's paging rules, as on-call people expect them: cooldown, digest, and repeat until acknowledged.

A pure core, no I/O and no clock of its own (`now` is given, in seconds): `Pager.take(env, token, now)`
says what to send for one event and which tokens (the caller's handles on the JetStream messages that
carried the events) are done with; `Pager.due(now)` what the passing time makes due. A token is
released only once nothing more hangs on its message, so the unacked messages of notify's durable
consumer are the state: a notify killed in between gets them again and rebuilds its pages and digests.

- **Cooldown** (`cooldown_s`): an alert whose (run_id, alert_id) was sent less than cooldown_s before
  (by the events' own times) is not sent again, unless its severity rises; a resolution always goes,
  and starts the alert afresh. What cooldown holds is notify's memory only: after a restart, the first
  repeat of an alert sent before it goes again (at least once, never lost).
- **Digest** (`digest_every_s`): alerts of `digest_severity` (default info) wait, and go as one message
  digest_every_s after the first of them came; their messages are acked once the digest is delivered.
- **Repeat until acknowledged** (`repeat_every_s`): an open alert of the highest severity (`fail`) is a
  page: sent at once, then again every repeat_every_s, until an `alert_ack` event for its (run_id,
  alert_id) or its resolution arrives. Its message stays unacked until then. An acknowledgement that
  finds no page open (its page was redelivered late, after a restart) is kept ACK_GRACE of the
  consumer's ack_wait, its message held as long, so that the page it acknowledges is not paged again.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime

from runledger.interop.routes import SEVERITIES, Route

PAGE_SEVERITY = SEVERITIES[-1]  # the highest (fail): the one that pages until someone takes it
ACK_GRACE = 3  # an acknowledgement with no page open waits this many ack_waits for a page redelivered late
MEMORY = 100_000  # cooldown and acknowledgement entries kept at most (the oldest go first)


def event_s(env: dict) -> float:
    """The event's own time, in seconds since the epoch (cooldowns are measured in it, not in arrival)."""
    return datetime.fromisoformat(env["time"].replace("Z", "+00:00")).timestamp()


def rank(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else 1


@dataclass
class Out:
    """One request to make: an event (`repeat` 0: the first time), a page's repeat, or a digest of events;
    `key` its Idempotency-Key, `releases` the tokens done with once it is delivered."""

    key: str
    envs: list[dict]
    repeat: int = 0
    digest: bool = False
    releases: list = field(default_factory=list)


@dataclass
class Page:
    env: dict
    tokens: list
    last_sent: float
    repeats: int = 0


def page_key(env: dict) -> tuple[str, str]:
    return env["run_id"], env["payload"]["alert_id"]


class Pager:
    """The paging state of one route (see the module docstring)."""

    def __init__(self, route: Route, ack_wait_s: float = 30.0) -> None:
        self.route = route
        self.ack_wait_s = ack_wait_s
        self.sent: OrderedDict[tuple[str, str], tuple[float, int]] = OrderedDict()  # key -> (event time, rank)
        self.digest: list[tuple[dict, object]] = []
        self.digest_since: float | None = None
        self.pages: dict[tuple[str, str], Page] = {}
        self.acks: OrderedDict[tuple[str, str], float] = OrderedDict()  # key -> the acknowledgement's event time
        self.orphans: list[tuple[float, object]] = []  # (until, token) of acknowledgements that found no page
        self.suppressed = 0

    # ------------------------------------------------------------------------------ events

    def take(self, env: dict, token, now: float) -> tuple[list[Out], list]:
        """What to send now for `env` (its message is `token`), and the tokens released now."""
        if env["kind"] == "alert_ack":
            return [], self._acknowledged(env, token, now)
        if env["kind"] != "alert":
            return [Out(env["event_id"], [env], releases=[token])], []
        p, key, t = env["payload"], page_key(env), event_s(env)
        resolved = p.get("state") == "resolved"
        severity = rank(p.get("severity", "warn"))
        if resolved:
            self.sent.pop(key, None)
            page = self.pages.pop(key, None)
            released = page.tokens if page else []
        else:
            released = []
            last = self.sent.get(key)
            if self.route.cooldown_s and last is not None and t - last[0] < self.route.cooldown_s and severity <= last[1]:
                self.suppressed += 1
                return [], [token]
            self._remember(self.sent, key, (t, severity))
        if p.get("severity") in self.route.digest_severity and self.route.digest_every_s:
            if self.digest_since is None:
                self.digest_since = now
            self.digest.append((env, token))
            return [], released
        if not resolved and self.route.repeat_every_s and p.get("severity") == PAGE_SEVERITY:
            acked = self.acks.get(key)
            if acked is not None and t <= acked:  # a page already taken (delivered again after a restart)
                return [], [*released, token]
            page = self.pages.get(key)
            if page is None:
                self.pages[key] = Page(env, [token], now)
            else:  # the same alert again (no cooldown held it back): one page, the latest event
                page.env, page.last_sent = env, now
                page.tokens.append(token)
            return [Out(env["event_id"], [env])], released
        return [Out(env["event_id"], [env], releases=[token])], released

    def _acknowledged(self, env: dict, token, now: float) -> list:
        key = page_key(env)
        self._remember(self.acks, key, event_s(env))
        page = self.pages.pop(key, None)
        if page is None:
            self.orphans.append((now + ACK_GRACE * self.ack_wait_s, token))
            return []
        return [*page.tokens, token]

    @staticmethod
    def _remember(memory: OrderedDict, key, value) -> None:
        memory[key] = value
        memory.move_to_end(key)
        if len(memory) > MEMORY:
            memory.popitem(last=False)

    # ------------------------------------------------------------------------------ time

    def due(self, now: float) -> tuple[list[Out], list]:
        """What is due by `now`: the digest, the pages' repeats; and the tokens released (orphan acks)."""
        outs: list[Out] = []
        if self.digest and now >= self.digest_since + self.route.digest_every_s:
            envs = [e for e, _ in self.digest]
            outs.append(Out(f"digest:{self.route.name}:{envs[0]['event_id']}", envs, digest=True,
                            releases=[tok for _, tok in self.digest]))
            self.digest, self.digest_since = [], None
        for page in self.pages.values():
            if now >= page.last_sent + self.route.repeat_every_s:
                page.repeats += 1
                page.last_sent = now
                outs.append(Out(f"{page.env['event_id']}:repeat:{page.repeats}", [page.env], repeat=page.repeats))
        released = [tok for until, tok in self.orphans if now >= until]
        self.orphans = [(until, tok) for until, tok in self.orphans if now < until]
        return outs, released

    def next_due(self) -> float | None:
        """When `due` has something next (None: nothing waits)."""
        times = [page.last_sent + self.route.repeat_every_s for page in self.pages.values()]
        times += [until for until, _ in self.orphans]
        if self.digest:
            times.append(self.digest_since + self.route.digest_every_s)
        return min(times, default=None)
