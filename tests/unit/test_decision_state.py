"""What became of a decision, one rule for replay, the worker's feed, the ledger poller and the agents:
make, review, answer, and ask what is ready and what is in force."""

from __future__ import annotations

from runledger.ledger.check.replay import replay
from runledger.ledger.contract import decision_state as ds


def made(i, mode="auto", action="set_dispatch"):
    return {"decision_id": f"d{i}", "agent": "agent-x", "rule": "r", "action": action,
            "params": {"dispatch": "dropless"}, "rationale": "x", "mode": mode}


def review(action, target, by="person:me"):
    return {"decision_id": f"{by}:{action}:{target}", "agent": by, "rule": "review", "action": action,
            "params": {"decision_id": target}, "rationale": "ok", "mode": "auto"}


def answer(i, status="applied", action="set_dispatch"):
    return {"decision_id": f"d{i}", "action": action, "status": status}


def status(decisions, i):
    return decisions[f"d{i}"]["status"]


def test_each_state_from_made_to_answered():
    d: dict = {}
    ds.fold_decision(d, made(1), step=5)  # auto: decided, in force at once
    ds.fold_decision(d, made(2, "proposed"), step=5)  # waits for a review
    ds.fold_decision(d, made(3, "proposed"), step=5)
    assert (status(d, 1), status(d, 2), status(d, 3)) == (ds.DECIDED, ds.PROPOSED, ds.PROPOSED)
    assert d["d1"]["decided_at_step"] == 5 and d["d1"]["applied_at_step"] is None
    ds.fold_decision(d, review("approve", "d2"))
    ds.fold_decision(d, review("reject", "d3"))
    assert (status(d, 2), status(d, 3)) == (ds.APPROVED, ds.REJECTED)
    assert d["d2"]["reviewed_by"] == "person:me"
    assert [x["decision_id"] for x in ds.ready(d)] == ["d1", "d2"]
    ds.fold_applied(d, answer(1), step=6)
    ds.fold_applied(d, answer(2, ds.REFUSED), step=6)
    assert (status(d, 1), status(d, 2)) == (ds.APPLIED, ds.REFUSED)
    assert d["d1"]["applied_at_step"] == 6
    assert ds.ready(d) == []
    # in force: neither rejected nor refused; a proposal waiting for its review counts
    ds.fold_decision(d, made(4, "proposed"))
    assert ds.in_force(d, "set_dispatch") == [d["d1"], d["d4"]]
    assert ds.in_force(d, "set_token_horizon") == []


def test_a_review_counts_only_for_a_proposal_not_yet_reviewed():
    d: dict = {}
    ds.fold_decision(d, review("approve", "d1"))  # before the decision: nothing to review yet
    ds.fold_decision(d, made(1, "proposed"))
    assert status(d, 1) == ds.PROPOSED
    ds.fold_decision(d, review("reject", "d1"))
    ds.fold_decision(d, review("approve", "d1", by="person:other"))  # the first review counts
    assert status(d, 1) == ds.REJECTED and d["d1"]["reviewed_by"] == "person:me"
    ds.fold_decision(d, made(2))
    ds.fold_decision(d, review("reject", "d2"))  # an auto decision is not reviewed
    assert status(d, 2) == ds.DECIDED
    assert "person:me:reject:d2" not in d  # a review is not a decision of its own


def test_a_decision_is_made_once_and_its_latest_answer_counts():
    d: dict = {}
    ds.fold_decision(d, made(1, "proposed"))
    ds.fold_decision(d, review("approve", "d1"))
    ds.fold_decision(d, made(1), step=9)  # made again (an agent that restarted): nothing changes
    assert status(d, 1) == ds.APPROVED and d["d1"]["mode"] == "proposed"
    ds.fold_applied(d, answer(1, ds.REFUSED), step=3)
    ds.fold_applied(d, answer(1), step=4)
    assert status(d, 1) == ds.APPLIED and d["d1"]["applied_at_step"] == 4
    # answered before the decision was seen: the record is filled in, the answer stands
    ds.fold_applied(d, answer(2), step=7)
    assert status(d, 2) == ds.APPLIED
    ds.fold_decision(d, made(2), step=6)
    assert status(d, 2) == ds.APPLIED and d["d2"]["agent"] == "agent-x" and d["d2"]["applied_at_step"] == 7
    assert ds.ready(d) == []


def test_ready_leaves_out_what_was_handed_out_and_keeps_the_order_made():
    d: dict = {}
    for i in (3, 1, 2):
        ds.fold_decision(d, made(i))
    assert ds.ready(d) == [{"decision_id": f"d{i}", "action": "set_dispatch", "params": {"dispatch": "dropless"}}
                           for i in (3, 1, 2)]
    assert [x["decision_id"] for x in ds.ready(d, {"d1"})] == ["d3", "d2"]


def test_replay_folds_decisions_by_the_same_rule():
    events = [("decision", made(1, "proposed"), 2), ("decision", review("approve", "d1"), 3),
              ("decision", made(2), 3), ("decision_applied", answer(1), 4), ("decision", made(3, "proposed"), 4),
              ("decision", review("reject", "d3"), 5)]
    state = replay("r", [{"kind": k, "payload": p, "step": s, "stream_seq": n, "attempt": 0}
                         for n, (k, p, s) in enumerate(events, 1)])
    folded: dict = {}
    for kind, p, s in events:
        (ds.fold_decision if kind == "decision" else ds.fold_applied)(folded, p, s)
    assert state.decisions == folded
    assert {k: v["status"] for k, v in state.decisions.items()} == {"d1": ds.APPLIED, "d2": ds.DECIDED, "d3": ds.REJECTED}
    assert [x["decision_id"] for x in ds.ready(state.decisions)] == ["d2"]


def test_answered_is_what_a_resumed_worker_must_not_carry_out_again():
    d: dict = {}
    for i in (1, 2, 3):
        ds.fold_decision(d, made(i))
    ds.fold_applied(d, answer(1), step=4)
    ds.fold_applied(d, answer(2, ds.REFUSED), step=4)
    assert ds.answered(d) == {"d1", "d2"}
    assert [x["decision_id"] for x in ds.ready(d, ds.answered(d))] == ["d3"]
