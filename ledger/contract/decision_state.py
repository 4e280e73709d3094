"""What became of each decision: one pure fold of a run's `decision` and `decision_applied` payloads.

A decision is made `decided` (mode auto: in force at once) or `proposed` (mode proposed: it waits for
a review). A review is itself a decision, action `approve` or `reject` with params.decision_id: the
first review of a proposed decision makes it `approved` or `rejected`; a review of anything else (an
auto decision, one reviewed already, one not made yet) changes nothing. A decision id is made once:
a second decision with the same id changes nothing. The worker answers with `decision_applied`:
`applied` or `refused` (the latest answer counts).

- ready: decided or approved, and not answered yet: what the worker is to carry out.
- answered: applied or refused: what a resumed worker does not carry out again.
- in force: neither rejected nor refused (a proposal waiting for its review counts, so that no agent
  makes it twice).

Replay (`RunState.decisions` is the `decisions` dict below), the worker's DecisionFeed and its resume,
the ledger poller of runledger.training.decisions and the agents all decide a decision's state here.
"""

from __future__ import annotations

PROPOSED, DECIDED, APPROVED, REJECTED = "proposed", "decided", "approved", "rejected"
APPLIED, REFUSED = "applied", "refused"
UNKNOWN = "unknown"  # answered, but the decision itself is not in the record (yet)
REVIEWS = {"approve": APPROVED, "reject": REJECTED}


def fold_decision(decisions: dict[str, dict], payload: dict, step: int | None = None) -> None:
    """Fold one `decision` payload (made at `step`) into `decisions`: decision_id -> its record."""
    if payload["action"] in REVIEWS:
        target = decisions.get((payload.get("params") or {}).get("decision_id", ""))
        if target is not None and target["status"] == PROPOSED:
            target.update(status=REVIEWS[payload["action"]], reviewed_by=payload["agent"])
        return
    known = decisions.get(payload["decision_id"])
    if known is not None and "mode" in known:
        return  # made already
    mode = payload.get("mode", "auto")
    made = {
        "action": payload["action"], "params": payload.get("params", {}), "agent": payload["agent"],
        "rule": payload["rule"], "mode": mode, "status": PROPOSED if mode == "proposed" else DECIDED,
        "decided_at_step": step, "applied_at_step": None,
    }
    if known is not None:  # answered before it was seen: the answer stands
        made.update(status=known["status"], applied_at_step=known["applied_at_step"])
    decisions[payload["decision_id"]] = made


def fold_applied(decisions: dict[str, dict], payload: dict, step: int | None = None) -> dict:
    """Fold one `decision_applied` payload (emitted at `step`) into `decisions`; returns the record."""
    d = decisions.setdefault(payload["decision_id"], {"action": payload["action"], "params": {}, "status": UNKNOWN})
    d["status"] = payload.get("status", APPLIED)
    d["applied_at_step"] = step
    return d


def is_ready(d: dict) -> bool:
    return d["status"] in (DECIDED, APPROVED)  # (an answer makes it applied or refused)


def is_in_force(d: dict) -> bool:
    return d["status"] not in (REJECTED, REFUSED)


def ready(decisions: dict[str, dict], handed_out: set[str] = frozenset()) -> list[dict]:
    """The decisions to carry out, in the order they were made, as the worker takes them
    ({decision_id, action, params}), leaving out those in `handed_out`."""
    return [{"decision_id": did, "action": d["action"], "params": d.get("params", {})}
            for did, d in decisions.items() if is_ready(d) and did not in handed_out]


def answered(decisions: dict[str, dict]) -> set[str]:
    """The ids of the decisions the worker answered (applied or refused): never to be carried out again."""
    return {did for did, d in decisions.items() if d["status"] in (APPLIED, REFUSED)}


def in_force(decisions: dict[str, dict], action: str) -> list[dict]:
    """The records of the decisions of `action` that are in force."""
    return [d for d in decisions.values() if d.get("action") == action and is_in_force(d)]
