"""Grad-norm agent: above the threshold, or rising steadily over the window → alert."""

from __future__ import annotations

from agents.policy import Action, alert

NAME = "agent-grad-norm"
EVIDENCE = "evidence/grad_norm"


def decide(state, evidence: list[dict], th: dict) -> list[Action]:
    if not evidence or not evidence[0]["n"]:
        return []
    e = evidence[0]
    ev = {"query": EVIDENCE, "rows": evidence, "ledger_position": state.last_stream_seq}
    out = []
    if e["max_grad_norm"] > th["grad_norm_max"]:
        out.append(alert(NAME, state.run_id, "grad_norm_high", e["step"] // 50,
                         f"grad norm {e['max_grad_norm']:.2f} above {th['grad_norm_max']} near step {e['step']}", ev))
    if e["n"] >= th["window_steps"] and (e["slope"] or 0) > th["grad_norm_slope_max"] and (e["rising_frac"] or 0) >= 0.7:
        out.append(alert(NAME, state.run_id, "grad_norm_rising", e["step"] // 50,
                         f"grad norm rising by {e['slope']:.3f} per step over the last {e['n']} steps", ev))
    return out
