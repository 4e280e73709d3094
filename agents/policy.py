"""What an agent is: a pure policy `decide(state, evidence, thresholds) -> list[Action]`.

An Action is a decision (becomes a `decision` event) or an alert (an `alert` event); either carries
the evidence that caused it. Thresholds default to the anchors in DESIGN.md and are overridden by the
run's `run_started.thresholds`. Ids are derived from the situation, not from the clock, so an agent
that restarts and sees the same evidence proposes the same id, and the runner does not repeat it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# DESIGN.md, "Numbers from the anchors"
THRESHOLDS: dict[str, float] = {
    "grad_norm_max": 2.0,  # Marin alert: grad norm > 2.0
    "grad_norm_slope_max": 0.01,  # rising trend per step over the window (alert)
    "skipped_steps_max": 3,  # >= 3 skipped steps ...
    "skipped_window_s": 900.0,  # ... in 15 min
    "drop_fraction_max": 0.07,  # drop fraction > 7%
    "silence_max_s": 600.0,  # telemetry silent > 10 min
    "contingency_fraction": 0.25,  # the first ~25% of the token budget
    "throughput_tolerance": 0.10,  # a shortfall under 10% is noise, not a contingency
    "max_capacity_factor": 2.0,  # the memory budget for capacity buffers (cf_recv)
    "capacity_factor_step": 1.5,  # how much a set_capacity_factor raises the factors
    "window_steps": 10,  # the trailing window the agents look at
}


@dataclass(frozen=True)
class Action:
    """A decision or an alert an agent wants recorded (the payload of a decision/alert event)."""

    kind: str  # "decision" | "alert"
    id: str
    rule: str
    action: str | None = None  # decisions: set_token_horizon, set_dispatch, ...
    params: dict = field(default_factory=dict)
    rationale: str = ""
    evidence: dict = field(default_factory=dict)
    mode: str = "auto"
    severity: str = "warn"

    def payload(self, agent: str) -> dict:
        if self.kind == "decision":
            return {"decision_id": self.id, "agent": agent, "rule": self.rule, "action": self.action,
                    "params": self.params, "rationale": self.rationale, "evidence": self.evidence, "mode": self.mode}
        return {"alert_id": self.id, "agent": agent, "rule": self.rule, "severity": self.severity,
                "message": self.rationale, "evidence": self.evidence}


def decision(agent: str, run_id: str, rule: str, key: Any, action: str, params: dict, rationale: str,
             evidence: dict, mode: str = "auto") -> Action:
    return Action("decision", f"{agent}:{run_id}:{rule}:{key}", rule, action, params, rationale, evidence, mode)


def alert(agent: str, run_id: str, rule: str, key: Any, message: str, evidence: dict, severity: str = "warn") -> Action:
    return Action("alert", f"{agent}:{run_id}:{rule}:{key}", rule, rationale=message, evidence=evidence,
                  severity=severity)


def thresholds_for(run_thresholds: dict | None) -> dict[str, float]:
    return {**THRESHOLDS, **(run_thresholds or {})}


def in_force(state, action: str) -> list[dict]:
    """The run's decisions of `action` that were made and not rejected (from the replayed state)."""
    return [d for d in state.decisions.values() if d.get("action") == action and d.get("status") not in ("rejected", "refused")]
