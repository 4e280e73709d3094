"""A worker's view of its run's decisions: auto at once, proposed only once approved, never twice."""

from __future__ import annotations

from runledger.ledger.contract import decision_state
from support.decisions import decision_payload


def person_review(action, target):
    return {"decision_id": f"p:{action}:{target}", "agent": "person:me", "rule": "review", "action": action,
            "params": {"decision_id": target}, "rationale": "ok"}


def test_ready_decisions_follow_approval_and_rejection():
    ds: dict = {}
    for x in (decision_payload(1), decision_payload(2, "proposed"), decision_payload(3, "proposed"), decision_payload(4)):
        decision_state.fold_decision(ds, x)
    assert [x["decision_id"] for x in decision_state.ready(ds)] == ["d1", "d4"]
    decision_state.fold_decision(ds, person_review("approve", "d2"))
    decision_state.fold_decision(ds, person_review("reject", "d3"))
    assert [x["decision_id"] for x in decision_state.ready(ds, {"d1"})] == ["d2", "d4"]
