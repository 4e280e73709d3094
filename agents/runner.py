"""Runs the agents on the live stream: new events wake it, the ledger's SQL is the evidence.

For each run with news (its own durable consumer on the stream tells which), the runner replays the
run's state, asks each agent's evidence query (`queries/evidence/*.sql`), calls the pure policies,
and records what they return as `decision`/`alert` events through an Emitter — unless an event with
that id is already in the ledger or was sent by this process, so a restarted runner does not decide
twice on the same evidence. The consumer's position advances whether or not anything is decided.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path

import duckdb
from pydantic import ValidationError

from runledger import queries
from runledger.queries import audit
from runledger.agents import drops, forecast, grad_norm, health, skipped, stall, telemetry, throughput
from runledger.agents.policy import Action
from runledger.ledger.bus import jetstream as bus
from runledger.ledger.storage import paths
from runledger.ledger.bus.natsserver import AGENTS_DURABLE
from runledger.ledger.emit.chains import next_attempt
from runledger.ledger.emit.emitter import Emitter
from runledger.ledger.contract.events import STREAM, InvalidEvent
from runledger.ledger.check.replay import replay_run
from runledger.ledger.bus.consumers import stream_seq
from runledger.ledger.storage.stored import until_stored
from runledger.ledger.redact import redact

log = logging.getLogger(__name__)

AGENTS = (throughput, drops, grad_norm, forecast, telemetry, skipped, stall, health)
# the agents on one evidence query each, recorded first; then those on audit checks (agents/health.py: a
# suite of checks, seconds on a busy machine), at most every AUDIT_EVERY_S per run, so that they never hold
# up a decision of the others
QUICK = tuple(a for a in AGENTS if a.EVIDENCE)
AUDITING = tuple(a for a in AGENTS if not a.EVIDENCE)
AUDIT_EVERY_S = 30.0
DURABLE = AGENTS_DURABLE  # (the secure server lets the agent role use only these consumers)
SWEEP_S = 30.0  # every run watched is evaluated at least this often (telemetry silence, stalls)
STORED_WAIT_S = 2.0  # how long to wait for the ledger to have stored the events that woke the agents
FOLLOW_CLOSE_S = 5.0  # moving to another server: how long the old server's emitters may take to send what they hold
RECENT_S = 86_400.0  # at start, unfinished runs heard from within a day are watched (one may have stalled)


def run_query(con: duckdb.DuckDBPyConnection, name: str, params: dict) -> list[dict]:
    """A named query's rows as dicts, given the parameters it uses ($run_id, $window, ...)."""
    sql = queries.load_query(name)
    used = set(re.findall(r"\$([a-z_]+)", sql))
    cur = con.execute(sql, {k: v for k, v in params.items() if k in used})
    cols = [d[0] for d in cur.description]
    return [{c: _json_value(v) for c, v in zip(cols, r)} for r in cur.fetchall()]


def _json_value(v):
    """Evidence goes into events: JSON values only (NaN → None, timestamps → RFC 3339 text)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    if isinstance(v, Decimal):
        return float(v)
    return v


def run_thresholds(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, float]:
    """The thresholds in force for the run, as the audit reads them (views.sql run_thresholds)."""
    return dict(con.execute("select name, value from run_thresholds where run_id = $r", {"r": run_id}).fetchall())


def evaluate(root: str | Path, run_id: str, agents=AGENTS) -> tuple[object, list[tuple[str, Action]]]:
    """The run's state and every agent's actions for it, on the ledger as it is now."""
    state = replay_run(root, run_id)
    if state.events == 0:
        return state, []
    # only the views the agents' queries reach (defining all of them was most of an evaluation's time)
    uses = "\n;\n".join([*(queries.load_query(a.EVIDENCE) for a in agents if a.EVIDENCE), "select * from run_thresholds"])
    con = queries.connect(root, uses=uses)
    th = run_thresholds(con, run_id)
    params = {"run_id": run_id, "window": int(th["agent_window_steps"]), "window_s": float(th["skipped_window_s"])}
    out = []
    for agent in agents:
        if agent.EVIDENCE is None:  # an agent on audit checks (agents/health.py): their rows for the run
            rows = audit.run_suite(root, "health", run_id, only=agent.CHECKS).rows()
            evidence = [{k: _json_value(v) for k, v in r.items()} for r in rows]
        else:
            evidence = run_query(con, agent.EVIDENCE, params)
        for action in agent.decide(state, evidence, th):
            out.append((agent.NAME, action))
    return state, out


def recent_runs(root: str | Path, within_s: float = RECENT_S) -> set[str]:
    """Runs not finished and heard from within `within_s`: what a (re)started runner watches before any
    news, since a run that went silent before it started sends none."""
    try:
        con = queries.connect(root)
        rows = con.execute("select run_id from events where run_id not in (select run_id from runs_finished) "
                           "group by run_id having epoch(now()) - epoch(max(ts)) < $s", {"s": within_s}).fetchall()
    except (duckdb.Error, OSError, paths.NotALedger) as err:  # (a root with nothing stored yet, say)
        log.debug("no recent runs read from %s: %s", root, err)
        return set()
    return {r[0] for r in rows}


def recorded_ids(root: str | Path, run_id: str) -> set[str]:
    con = queries.connect(root)
    ids = {r[0] for r in con.execute("select decision_id from decisions where run_id = $r", {"r": run_id}).fetchall()}
    # an alert that resolves keeps the id of the one it resolves: recorded as Action.key says; only the
    # agent's own (its id begins with its producer's name), so another's alert under that id hides none
    ids |= {r[0] for r in con.execute("select alert_id || if(state = 'resolved', ':resolved', '') from alerts "
                                      "where run_id = $r and starts_with(alert_id, producer || ':')",
                                      {"r": run_id}).fetchall()}
    return ids


# (root, run_id, decision ids revised already) -> [(decision_id, its revision's forecast events)]
Revise = Callable[[Path, str, set[str]], list[tuple[str, list]]]


class Runner:
    """The agents process: its emitters (one per run and agent) and what it has sent."""

    def __init__(self, root: str | Path, nats_url: str | None, revise: Revise | None = None):
        self.root, self.nats_url = Path(root), nats_url
        self.emitters: dict[tuple[str, str], Emitter] = {}
        self.sent: set[str] = set()
        self.revise = revise
        self.revised: set[str] = set()  # decision ids whose plan this process re-forecast
        self.considered: set[str] = set()  # applied decisions `revise` was asked about
        self.audited: dict[str, float] = {}  # run -> when the auditing agents last looked at it (monotonic)

    def reforecast(self, run_id: str, state) -> int:
        """Record the revised forecast of each plan change not yet re-forecast (asked only when the replayed
        `state` has an applied decision not asked about before); returns the events sent."""
        applied = {did for did, d in state.decisions.items() if d.get("status") == "applied"}
        if self.revise is None or applied <= self.considered:
            return 0
        try:
            pending = self.revise(self.root, run_id, set(self.revised))
        except (ValueError, OSError, duckdb.IOException) as err:  # a fit that cannot say, or files moving
            log.warning("re-forecasting %s: %s; trying again next round", run_id, str(err).splitlines()[0])
            return 0
        except Exception:  # a re-forecasting bug must not stop the agents: said, and not asked again
            log.exception("re-forecasting %s failed", run_id)
            self.considered |= applied
            return 0
        self.considered |= applied
        sent = 0
        for decision_id, events in pending:
            em = self.emitter(run_id, "ladder", continue_spooled=False)
            for e in events:
                em.emit(e, step=max(e.from_step - 1, 0))
            self.revised.add(decision_id)
            sent += len(events)
            log.info("ladder: %s re-forecast for decision %s (%d points)", run_id, decision_id, len(events))
        return sent

    def emitter(self, run_id: str, producer: str, continue_spooled: bool = True) -> Emitter:
        """The producer's emitter for the run (its spooled chain again, unless `continue_spooled` is False:
        the ladder's chains belong to the ladder's own runs, and a revision starts an attempt of its own)."""
        key = (run_id, producer)
        if key not in self.emitters:
            spool = self.root / "spool"
            attempt = next_attempt(run_id, producer, spool, root=self.root, continue_spooled=continue_spooled)
            self.emitters[key] = Emitter(run_id, producer, attempt, self.nats_url, spool)
        return self.emitters[key]

    def step(self, run_id: str) -> list[Action]:
        """Evaluate one run and record whatever is new; returns the actions recorded."""
        done = self.record(run_id, QUICK)
        now = time.monotonic()
        if AUDITING and now - self.audited.get(run_id, -math.inf) >= AUDIT_EVERY_S:
            self.audited[run_id] = now
            done += self.record(run_id, AUDITING)
        return done

    def record(self, run_id: str, agents) -> list[Action]:
        """Evaluate one run with `agents` and record whatever is new; returns the actions recorded."""
        try:
            state, actions = evaluate(self.root, run_id, agents)
        except (duckdb.IOException, OSError) as err:  # a file compacted away while reading: next time
            log.debug("evaluating %s: %s; trying again next round", run_id, err)
            return []
        if agents is QUICK:
            self.reforecast(run_id, state)
        if not actions:
            return []
        known = recorded_ids(self.root, run_id) | self.sent
        done = []
        for agent, action in actions:
            if action.key in known:
                continue
            try:
                self.emitter(run_id, agent).emit(action.event(agent), step=state.step)
            except OSError as err:  # the ledger's files moved under next_attempt: next round
                log.debug("recording for %s: %s; trying again next round", run_id, err)
                return done
            except (InvalidEvent, ValidationError) as err:  # a policy bug must not stop the other agents
                log.error("%s: %s %s not recorded: %s", agent, action.kind, action.id, err)
                continue
            self.sent.add(action.key)
            known.add(action.key)
            done.append(action)
            log.info("%s %s %s: %s", agent, action.kind, action.action or action.rule, action.rationale)
        return done

    def follow(self, url: str) -> None:
        """Emit to `url` from now on: the emitters of another server are closed (what they had not sent
        stays in their spool, which the next emitter of the chain, or the root's supervisor, sends)."""
        if url != self.nats_url:
            for em in self.emitters.values():
                em.close(FOLLOW_CLOSE_S, say_unsent=False)
            self.emitters.clear()
            self.nats_url = url

    def close(self) -> None:
        for em in self.emitters.values():
            em.close()


def woke_upto(msgs) -> dict[str, int]:
    """Per run, the stream seq of the last of `msgs` (what the ledger is to have stored before judging)."""
    upto: dict[str, int] = {}
    for m in msgs:
        parts = m.subject.split(".")
        if len(parts) == 3:
            upto[parts[1]] = max(upto.get(parts[1], 0), stream_seq(m))
    return upto


async def run_agents(root: str | Path, nats_url: str | Callable[[], str | None], run_id: str | None = None,
                     stop: asyncio.Event | None = None, poll_s: float = 1.0, revise: Revise | None = None,
                     sweep_s: float = SWEEP_S) -> None:
    """Until `stop`: wake on new events, evaluate the runs they belong to, record decisions (and, with
    `revise`, re-forecast plans that applied decisions changed). Every `sweep_s` each watched run is evaluated
    even without news: a run that went silent (a stall) wakes nothing.

    `nats_url` may be a function naming the server each time it is called (None: none now), as for
    `runledger.interop.notify.serve`: the agents wait for one, and once it names another (a root's embedded
    server stopped when idle and came back on a new port) they let the old connection and emitters go and
    take up their consumer on the new server, where the same JetStream store holds it."""
    stop = stop or asyncio.Event()
    url_of = nats_url if callable(nats_url) else (lambda: nats_url)
    runner = Runner(root, None, revise)
    durable = DURABLE if run_id is None else f"{DURABLE}-{run_id}"
    watched: set[str] = set()
    try:
        while not stop.is_set():
            got = await bus.connect_when(url_of, stop, "agents", poll_s)
            if got is None:
                break
            nc, url = got
            await asyncio.to_thread(runner.follow, url)
            try:
                await _consume(nc, url, url_of, runner, root, run_id, durable, watched, stop, poll_s, sweep_s)
            finally:
                await bus.close(nc, url)
    finally:
        await asyncio.to_thread(runner.close)


async def _consume(nc, url: str, url_of, runner: Runner, root: str | Path, run_id: str | None, durable: str,
                   watched: set[str], stop: asyncio.Event, poll_s: float, sweep_s: float) -> None:
    """The agents on one connection until `stop`, or until `url_of()` names another server."""
    subject = f"runledger.{run_id}.>" if run_id else "runledger.>"
    js = nc.jetstream()
    await bus.ensure_stream(js)
    await bus.ensure_consumer(js, durable, filter_subject=subject)
    sub = await bus.Puller(nc, STREAM, durable).start()
    watched |= {r for r in await asyncio.to_thread(recent_runs, root) if run_id in (None, r)}
    log.info("agents: consumer %s at %s", durable, redact(url))
    previous: set[str] = set(watched)
    last_sweep = time.monotonic()
    while not stop.is_set():
        if (now := url_of()) != url:
            log.info("agents: the server moved from %s to %s: following it", redact(url),
                     redact(now) if now else "none yet")
            return
        try:
            msgs = await sub.fetch(1000, timeout=poll_s)
        except bus.PullError as err:  # the server is not ready (a leader election, say): try again
            log.warning("%s", err)
            await asyncio.sleep(poll_s)
            msgs = []
        news = set()
        for m in msgs:
            parts = m.subject.split(".")
            if len(parts) == 3 and parts[2] not in ("decision", "alert"):
                news.add(parts[1])
        watched |= news
        if news:  # judge on the events that woke us: wait (a little) for the ledger to have stored them
            await until_stored(root, woke_upto(msgs), STORED_WAIT_S)
        if time.monotonic() - last_sweep > sweep_s:  # silence is news too: look at every run now and then
            news, last_sweep = set(watched), time.monotonic()
        # the ledger may not have stored the newest events yet: look again on the next round too
        failed = set()
        for r in sorted(news | previous):
            try:
                await asyncio.to_thread(runner.step, r)
            except duckdb.Error as err:  # a file compacted away mid-query, say: look again next round
                log.warning("agents: evaluating run %s failed (%s); trying again", r, str(err).splitlines()[0])
                failed.add(r)
        previous = news | failed
        for m in msgs:  # the position advances whether or not anything was decided
            try:
                await m.ack()
            except Exception as err:  # (the server went away: the message comes again, and is recognised)
                log.warning("agents: ack failed: %s", err)
