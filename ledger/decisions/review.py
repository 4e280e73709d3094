"""A person's review of a proposed decision (approve or reject), recorded like an agent's decision: the
one path `runledger decide --approve/--reject` and the dashboard's buttons share.

`review(run_id, target, approve, by)` makes the typed `DecisionMade` (agent `person:NAME`, action
approve/reject, params.decision_id the target); `record(root, nats_url, run_id, decision)` checks the
target against the run's replayed state and emits it through the NATS `Emitter` (spool first, so an
event it accepted is never lost), on the chain of `producer` (the CLI's `cli`, the dashboard's `ui`).
"""

from __future__ import annotations

import re

from runledger.ledger import settings
from runledger.ledger.contract.decision_state import PROPOSED

PERSON = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._@+-]{0,63}$")  # a name shown in the audit, never markup


class ReviewRefused(ValueError):
    """The review cannot be made: no such decision, or not one waiting for a review, or a bad name."""


def review(target: str, approve: bool, by: str, reason: str | None = None, strict: bool = True):
    """The person's approval (or rejection) of decision `target` as a typed `DecisionMade` (`strict`: `by`
    must be a plain name, as it is where anyone can type it, the dashboard; the CLI passes the login name)."""
    from runledger.ledger.contract.events import DecisionMade

    if (strict and not PERSON.match(by or "")) or not by:
        raise ReviewRefused(f"{by!r} is not a name: letters, digits, space and ._@+- (at most 64)")
    person = f"person:{by}"
    action = "approve" if approve else "reject"
    return DecisionMade(decision_id=f"{person}:{action}:{target}", agent=person, rule="review", action=action,
                        params={"decision_id": target}, rationale=reason or f"{action}d by {person}",
                        evidence={"reviewed": target}, mode="auto")


def record(root, nats_url: str, run_id: str, decision, producer: str = "cli", proposed_only: bool = False,
           timeout: float = 30.0) -> bool:
    """Emit `decision` for `run_id` (a review's target must be a decision of the run, and with
    `proposed_only` one still waiting for its review); True once NATS acknowledged it, False if it is
    spooled and will be sent next time."""
    from runledger.ledger.emit.chains import next_attempt
    from runledger.ledger.emit.emitter import Emitter
    from runledger.ledger.check.replay import replay_run
    from runledger.ledger.contract.validation import check_name

    check_name(run_id, "run_id")
    state = replay_run(root, run_id)
    target = getattr(decision.params, "decision_id", None) if decision.action in ("approve", "reject") else None
    if target is not None:
        if target not in state.decisions:
            raise ReviewRefused(f"no decision {target!r} in run {run_id!r}")
        if proposed_only and state.decisions[target].get("status") != PROPOSED:
            raise ReviewRefused(f"decision {target!r} is {state.decisions[target].get('status')}, not waiting for a review")
    spool = settings.spool_dir(root)
    attempt = next_attempt(run_id, producer, spool, root=root, continue_spooled=True)
    em = Emitter(run_id, producer, attempt, nats_url, spool)
    em.emit(decision, step=state.step)
    return em.close(timeout=timeout)
