"""A worker's view of its run's decisions: auto at once, proposed only once approved, never twice."""

from __future__ import annotations

import time

from runledger.ledger.contract import decision_state
from runledger.ledger.decisions.inbox import DecisionFeed
from runledger.ledger.emit.emitter import Emitter


def d(i, mode="auto"):
    return {"decision_id": f"d{i}", "agent": "a", "rule": "r", "action": "checkpoint_now", "rationale": "x", "mode": mode}


def review(action, target):
    return {"decision_id": f"p:{action}:{target}", "agent": "person:me", "rule": "review", "action": action,
            "params": {"decision_id": target}, "rationale": "ok"}


def test_ready_decisions_follow_approval_and_rejection():
    ds: dict = {}
    for x in (d(1), d(2, "proposed"), d(3, "proposed"), d(4)):
        decision_state.fold_decision(ds, x)
    assert [x["decision_id"] for x in decision_state.ready(ds)] == ["d1", "d4"]
    decision_state.fold_decision(ds, review("approve", "d2"))
    decision_state.fold_decision(ds, review("reject", "d3"))
    assert [x["decision_id"] for x in decision_state.ready(ds, {"d1"})] == ["d2", "d4"]


def test_the_feed_sees_decisions_made_before_and_after_it_started(tmp_path, nats_server):
    em = Emitter("fed", "agent-x", 0, nats_server.url, tmp_path / "spool")
    em.emit_dict("decision", d(1))
    em.emit_dict("decision", d(2, "proposed"))
    assert em.flush(30)
    feed = DecisionFeed("fed", nats_server.url, applied=set())
    try:
        assert feed.connected.wait(30)
        deadline = time.monotonic() + 30
        while [x["decision_id"] for x in feed.ready()] != ["d1"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [x["decision_id"] for x in feed.ready()] == ["d1"]
        feed.mark_applied("d1")
        person = Emitter("fed", "cli", 0, nats_server.url, tmp_path / "spool")
        person.emit_dict("decision", {"decision_id": "p1", "agent": "person:me", "rule": "review", "action": "approve",
                                 "params": {"decision_id": "d2"}, "rationale": "ok"})
        person.close()
        while [x["decision_id"] for x in feed.ready()] != ["d2"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [x["decision_id"] for x in feed.ready()] == ["d2"]
    finally:
        feed.close()
        em.close()
