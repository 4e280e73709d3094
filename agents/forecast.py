"""Forecast agent: the observed loss outside the ladder's band at the latest fraction reached of the
plan in force (the registered forecast, or the revision after a plan change) → alert, and checkpoint
now (so whatever is decided next can start from here)."""

from __future__ import annotations

from runledger.agents.policy import Action, alert, decision

NAME = "agent-forecast"
EVIDENCE = "evidence/forecast"


def decide(state, evidence: list[dict], th: dict) -> list[Action]:
    if not evidence or evidence[0]["observed_loss"] is None:
        return []
    e = evidence[0]
    if e["band_low"] <= e["observed_loss"] <= e["band_high"]:
        return []
    ev = {"query": EVIDENCE, "rows": evidence, "ledger_position": state.last_stream_seq}
    revision = e.get("revision") or 0
    key = f"{e['fraction']:.2f}" if not revision else f"r{revision}:{e['fraction']:.2f}"
    plan = "" if not revision else f" of the plan revised by {e['decision_id']}"
    why = (f"at {e['fraction']:.0%} of training{plan} the loss is {e['observed_loss']:.3f}, outside the forecast band "
           f"[{e['band_low']:.3f}, {e['band_high']:.3f}] (projected {e['projected_loss']:.3f})")
    return [alert(NAME, state.run_id, "forecast_deviation", key, why, ev, severity="fail"),
            decision(NAME, state.run_id, "forecast_deviation", key, "checkpoint_now", {}, why + "; checkpointing now", ev)]
