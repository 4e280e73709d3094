"""Throughput / MFU agent: if the run will miss its deadline (or runs below its planned FLOP rate, else tokens/s)
within the first ~25% of the token budget, shorten the token horizon to what fits, with the LR decay
retimed to still reach 5% of peak there (Marin's written contingency). After 25%: an alert only."""

from __future__ import annotations

import math

from runledger.agents.policy import Action, alert, decision, in_force

NAME = "agent-throughput"
EVIDENCE = "evidence/throughput"


def decide(state, evidence: list[dict], th: dict) -> list[Action]:
    if not evidence or state.status not in ("running", "unknown"):
        return []
    e = evidence[0]
    rate, step, tps = e["recent_tokens_per_s"], e["step"], e["tokens_per_step"]
    if not rate or not tps or (e["recent_steps"] or 0) < th["agent_window_steps"]:
        return []
    horizon_steps = int(state.schedule.get("horizon_steps") or math.ceil(e["token_budget"] / tps))
    horizon_tokens = horizon_steps * tps
    tokens_seen = e["tokens_seen"]
    elapsed = e["elapsed_s"] or 0.0
    if e["deadline_s"]:
        time_budget = e["deadline_s"]
    elif e["planned_tokens_per_s"] and e["planned_flops_per_token"] and e["flops_seen"] and e["flops_per_token_now"]:
        # the plan is a FLOP rate: after a context extension a token costs more FLOPs, and a healthy run
        # makes fewer tokens/s; the rest of the horizon is costed at the length trained now
        planned_flops_per_s = e["planned_tokens_per_s"] * e["planned_flops_per_token"]
        time_budget = (e["flops_seen"] + (horizon_tokens - tokens_seen) * e["flops_per_token_now"]) / planned_flops_per_s
    elif e["planned_tokens_per_s"]:
        time_budget = horizon_tokens / e["planned_tokens_per_s"]
    else:
        return []
    projected = elapsed + (horizon_tokens - tokens_seen) / rate
    if projected <= time_budget * (1 + th["throughput_tolerance"]):
        return []
    fits_tokens = tokens_seen + rate * max(time_budget - elapsed, 0.0)
    new_steps = max(int(fits_tokens // tps), step + 1)
    ev = {"query": EVIDENCE, "rows": evidence, "ledger_position": state.last_stream_seq}
    why = (f"at {tokens_seen / horizon_tokens:.0%} of the token horizon the run makes {rate:,.0f} tokens/s; "
           f"it would finish in {projected:,.0f}s against {time_budget:,.0f}s planned")
    if tokens_seen > th["contingency_fraction"] * horizon_tokens:
        return [alert(NAME, state.run_id, "throughput_late", horizon_steps, why + " (past the contingency window)", ev)]
    if in_force(state, "set_token_horizon") or new_steps >= horizon_steps:
        return []  # decided once already: its effect is what the next evidence will show
    return [decision(NAME, state.run_id, "throughput_contingency", horizon_steps, "set_token_horizon",
                     {"horizon_steps": new_steps, "horizon_tokens": new_steps * tps},
                     why + f"; shortening the horizon to {new_steps} steps ({new_steps * tps:,} tokens), "
                     "decay retimed to reach 5% of peak there", ev)]
