"""Skipped-steps agent: >= 3 skipped steps within the window → roll back to the last checkpoint."""

from __future__ import annotations

from runledger.agents.policy import Action, decision

NAME = "agent-skipped"
EVIDENCE = "evidence/skipped"


def decide(state, evidence: list[dict], th: dict) -> list[Action]:
    if not evidence or (evidence[0]["skipped"] or 0) < th["skipped_steps_max"]:
        return []
    e = evidence[0]
    if e["checkpoint_step"] is None:
        return []
    ev = {"query": EVIDENCE, "rows": evidence, "ledger_position": state.last_stream_seq}
    return [decision(NAME, state.run_id, "skipped_steps", e["first_skipped"], "rollback",
                     {"to_step": e["checkpoint_step"]},
                     f"{e['skipped']} skipped steps ({e['first_skipped']}..{e['last_skipped']}) within "
                     f"{th['skipped_window_s']:.0f}s; rolling back to the checkpoint of step {e['checkpoint_step']}", ev)]
