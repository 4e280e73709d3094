"""The decisions a run must follow, as they arrive: what a worker reads at each step boundary.

`DecisionFeed(run_id, nats_url)` follows `runledger.{run_id}.decision` on JetStream from the start
of the stream (an ordered consumer in a background thread), so a resumed worker sees every decision
ever made for its run. `ready()` returns, in order, the decisions that are ready as
`runledger.ledger.contract.decision_state` says (as replay would: an `auto` decision at once, a `proposed` one once a
person approved it, never one that was rejected) and not handed out yet. The worker applies them,
emits `decision_applied`, and calls `mark_applied`; decisions already answered in an earlier attempt
are passed in `applied` (from replay).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading

from nats.js.api import DeliverPolicy

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.contract import decision_state
from runledger.ledger.contract.events import subject_for

log = logging.getLogger(__name__)


class DecisionFeed:
    """A run's decisions as they arrive on the stream (see the module docstring)."""

    def __init__(self, run_id: str, nats_url: str, applied: set[str] | None = None):
        self.run_id, self.nats_url = run_id, nats_url
        self.applied: set[str] = set(applied or ())
        self._decisions: dict[str, dict] = {}  # decision_id -> its record (runledger.ledger.contract.decision_state)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"decisions-{run_id}", daemon=True)
        self._thread.start()

    def ready(self) -> list[dict]:
        with self._lock:
            return decision_state.ready(self._decisions, self.applied)

    def mark_applied(self, decision_id: str) -> None:
        with self._lock:
            self.applied.add(decision_id)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _take(self, env: dict) -> None:
        if not isinstance(env, dict) or env.get("kind") != "decision" or env.get("run_id") != self.run_id:
            return
        with self._lock:
            try:
                decision_state.fold_decision(self._decisions, env["payload"], env.get("step"))
            except (KeyError, TypeError, AttributeError):
                return  # not a decision payload; the ledger quarantines it

    def _main(self) -> None:
        asyncio.run(self._follow())

    async def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                nc = await bus.connect(self.nats_url, name=f"decisions-{self.run_id}")
                break
            except Exception as err:
                log.debug("decision feed: NATS not reachable yet (%s)", err)
                await asyncio.sleep(0.5)
        else:
            return

        async def on_msg(msg) -> None:
            try:
                body = json.loads(msg.data)
            except ValueError:
                return  # not an event; the ledger quarantines it
            for env in body if isinstance(body, list) else [body]:
                self._take(env)

        try:
            js = nc.jetstream()
            while not self._stop.is_set():
                try:
                    await bus.ensure_stream(js)
                    await js.subscribe(subject_for(self.run_id, "decision"), cb=on_msg, ordered_consumer=True,
                                       deliver_policy=DeliverPolicy.ALL)
                    break
                except Exception as err:  # no stream yet, or no permission to read it
                    log.debug("decision feed: cannot follow yet (%s)", err)
                    await asyncio.sleep(0.5)
            self.connected.set()
            while not self._stop.is_set():
                await asyncio.sleep(0.1)
        finally:
            await nc.close()
