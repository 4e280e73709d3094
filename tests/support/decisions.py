"""decisions: shared by the tests (tests/support: every helper defined once)."""

from __future__ import annotations


def decision_payload(i, mode="auto"):
    return {"decision_id": f"d{i}", "agent": "a", "rule": "r", "action": "checkpoint_now", "rationale": "x", "mode": mode}
