"""Telemetry agent: a running run silent for longer than the threshold → alert."""

from __future__ import annotations

from runledger.agents.policy import Action, alert

NAME = "agent-telemetry"
EVIDENCE = "evidence/telemetry"


def decide(state, evidence: list[dict], th: dict) -> list[Action]:
    if not evidence or evidence[0]["last_ts"] is None or evidence[0]["finished"]:
        return []
    e = evidence[0]
    if e["silent_s"] <= th["silence_max_s"]:
        return []
    ev = {"query": EVIDENCE, "rows": evidence, "ledger_position": state.last_stream_seq}
    return [alert(NAME, state.run_id, "telemetry_silent", str(e["last_ts"]),
                  f"no event for {e['silent_s']:.0f}s (limit {th['silence_max_s']:.0f}s)", ev)]
