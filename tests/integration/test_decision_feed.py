"""A worker's view of its run's decisions: auto at once, proposed only once approved, never twice."""

from __future__ import annotations

import time

from runledger.ledger.decisions.inbox import DecisionFeed
from runledger.ledger.emit.emitter import Emitter
from support.decisions import decision_payload


def test_the_feed_sees_decisions_made_before_and_after_it_started(tmp_path, nats_server):
    em = Emitter("fed", "agent-x", 0, nats_server.url, tmp_path / "spool")
    em.emit_dict("decision", decision_payload(1))
    em.emit_dict("decision", decision_payload(2, "proposed"))
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
