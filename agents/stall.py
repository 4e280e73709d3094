"""Stall agent: a running run with no step for `stall_factor` times its median step gap (and at least
`stall_min_s`) → a `stalled` alert; when steps come back (or the run ends), the same alert resolved.

Live: the runner evaluates every watched run on a timer (its sweep), so a run that stops producing
events, and so wakes nothing, is still looked at. The median is of the gaps between the run's recent
steps (by the producers' clock), else of its steps' own step_time_s when it has one step only.
"""

from __future__ import annotations

from runledger.agents.policy import Action, alert

NAME = "agent-stall"
EVIDENCE = "evidence/stall"
RULE = "stalled"


def decide(state, evidence: list[dict], th: dict) -> list[Action]:
    if not evidence:
        return []
    e = evidence[0]
    ev = {"query": EVIDENCE, "rows": evidence, "ledger_position": state.last_stream_seq}
    opened = e["open_alert_id"]
    if opened is not None:
        ended = state.status not in ("running", "unknown")
        if e["steps_after_alert"] or ended:
            why = (f"steps came back: {e['steps_after_alert']} since the stall alert" if e["steps_after_alert"]
                   else f"the run is {state.status}")
            return [Action("alert", opened, RULE, rationale=f"no longer stalled ({why})", evidence=ev, state="resolved")]
        return []
    if state.status != "running" or e["last_step_ts"] is None or e["silent_s"] is None:
        return []
    typical = e["median_gap_s"] if e["median_gap_s"] is not None else e["median_step_time_s"]
    limit = max(th["stall_factor"] * (typical or 0.0), th["stall_min_s"])
    if e["silent_s"] <= limit:
        return []
    # keyed by the steps stored so far: a run that stalls again after resolving gets a new alert
    return [alert(NAME, state.run_id, RULE, e["steps"],
                  f"no step for {e['silent_s']:.0f}s: more than {th['stall_factor']:g} x its median step gap "
                  f"{typical or 0.0:.2f}s (and at least {th['stall_min_s']:.0f}s); last step {state.step}", ev)]
