"""What an agent is: a pure policy `decide(state, evidence, thresholds) -> list[Action]`.

An Action is a decision (becomes a `decision` event) or an alert (an `alert` event); either carries
the evidence that caused it. Thresholds come from the rule book (queries/thresholds.py: the anchors in
DESIGN.md) as the run's `run_started.thresholds` override them (views.sql run_thresholds, which the
audit reads too). Ids are derived from the situation, not from the clock, so an agent that restarts
and sees the same evidence proposes the same id, and the runner does not repeat it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runledger.ledger.contract import decision_state
from runledger.ledger.contract.events import AlertRaised, DecisionMade


@dataclass(frozen=True)
class Action:
    """A decision or an alert an agent wants recorded (`event()`: the decision/alert event it becomes)."""

    kind: str  # "decision" | "alert"
    id: str
    rule: str
    action: str | None = None  # decisions: set_token_horizon, set_dispatch, ...
    params: dict = field(default_factory=dict)
    rationale: str = ""
    evidence: dict = field(default_factory=dict)
    mode: str = "auto"
    severity: str = "warn"
    state: str = "open"  # alerts: "resolved" closes the open alert of the same id (runledger.ledger.check.replay)

    @property
    def key(self) -> str:
        """What the runner records it by: the id, and for an alert that resolves, its state too (it keeps
        the id of the alert it resolves)."""
        return self.id if self.state == "open" else f"{self.id}:{self.state}"

    def event(self, agent: str) -> DecisionMade | AlertRaised:
        """The typed event to record (a policy's malformed action raises pydantic's ValidationError)."""
        if self.kind == "decision":
            return DecisionMade(decision_id=self.id, agent=agent, rule=self.rule, action=self.action,
                                params=self.params, rationale=self.rationale, evidence=self.evidence, mode=self.mode)
        return AlertRaised(alert_id=self.id, agent=agent, rule=self.rule, severity=self.severity,
                           message=self.rationale, evidence=self.evidence, state=self.state)


def decision(agent: str, run_id: str, rule: str, key: Any, action: str, params: dict, rationale: str,
             evidence: dict, mode: str = "auto") -> Action:
    return Action("decision", f"{agent}:{run_id}:{rule}:{key}", rule, action, params, rationale, evidence, mode)


def alert(agent: str, run_id: str, rule: str, key: Any, message: str, evidence: dict, severity: str = "warn") -> Action:
    return Action("alert", f"{agent}:{run_id}:{rule}:{key}", rule, rationale=message, evidence=evidence,
                  severity=severity)


def in_force(state, action: str) -> list[dict]:
    """The run's decisions of `action` that are in force (runledger.ledger.contract.decision_state), from the replayed state."""
    return decision_state.in_force(state.decisions, action)
