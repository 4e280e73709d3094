"""Health agent: the audit's checks that should fire live (issue 43), each failing row an alert with the
row as its evidence: a NaN loss, a loss spike, the router's entropy or bias, throughput under its floor,
an attempt still initializing, telemetry gone while the heartbeat goes on, a run down (crashed), and
an attempt started (informational, as Marin's task_retried). The checks read the run's thresholds and
health profile themselves (queries/health/*.sql), so this policy only says which rows to raise."""

from __future__ import annotations

import json

from runledger.agents.policy import Action, alert

NAME = "agent-health"
EVIDENCE = None  # the rows of CHECKS for the run (agents/runner.py runs them), not one evidence query
CHECKS = ("nonfinite_loss", "loss_spike", "router_entropy", "router_bias", "throughput_floor", "still_initializing",
          "telemetry_gone", "run_down", "attempt_started")
INFO = {"attempt_started"}  # raised at severity info, on its warn row


def decide(state, evidence: list[dict], th: dict) -> list[Action]:
    out = []
    for row in evidence:
        if row["check"] not in CHECKS or row["status"] not in ("fail", "warn"):
            continue
        info = row["check"] in INFO
        if row["status"] == "warn" and not info:
            continue
        detail = json.loads(row["evidence"] or "{}")
        # one alert per occurrence: a check's step (or, with none, its attempt or the run) keys it
        key = row["at_step"] if row["at_step"] is not None else detail.get("latest_attempt", detail.get("attempt", 0))
        message = (f"{row['check']}: {_num(row['value'])} against {_num(row['threshold'])}"
                   + (f" at step {row['at_step']}" if row["at_step"] is not None else ""))
        ev = {"query": f"health/{row['check']}", "rows": [row], "ledger_position": state.last_stream_seq}
        out.append(alert(NAME, state.run_id, row["check"], key, message, ev, severity="info" if info else "fail"))
    return out


def _num(v) -> str:
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)
