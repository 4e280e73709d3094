"""Token-drop agent: sustained drop fraction above the limit → raise the capacity factor while the
memory budget allows, else go dropless; before a scheduled context extension, hold it while drops
measured at the longer length exceed the limit, and release it once they do not."""

from __future__ import annotations

from runledger.agents.policy import Action, decision, in_force

NAME = "agent-drops"
EVIDENCE = "evidence/drops"


def decide(state, evidence: list[dict], th: dict) -> list[Action]:
    limit, window = th["drop_fraction_agent_max"], int(th["agent_window_steps"])
    trained = [r for r in evidence if r["what"] == "trained"]
    probes = [r for r in evidence if r["what"] == "probe"]
    ev = {"query": EVIDENCE, "ledger_position": state.last_stream_seq}
    out = []
    recent = trained[-window:]
    if len(recent) >= min(window, 3) and all(r["drop_fraction"] > limit for r in recent[-3:]):
        last = recent[-1]
        mean = sum(r["drop_fraction"] for r in recent) / len(recent)
        rows = {**ev, "rows": recent}
        if last["dispatch"] == "capacity":
            cf_send, cf_recv = last["cf_send"] or 1.0, last["cf_recv"] or 1.0
            step_up = th["capacity_factor_step"]
            if cf_recv * step_up <= th["max_capacity_factor"]:
                new = {"cf_send": round(cf_send * step_up, 4), "cf_recv": round(cf_recv * step_up, 4)}
                out.append(decision(NAME, state.run_id, "drops_high", f"cf{cf_recv}", "set_capacity_factor", new,
                                    f"drop fraction {mean:.1%} over the last {len(recent)} steps (limit {limit:.0%}); "
                                    f"raising capacity factors to {new} (within the memory budget "
                                    f"cf_recv <= {th['max_capacity_factor']})", rows))
            elif not in_force(state, "set_dispatch"):
                out.append(decision(NAME, state.run_id, "drops_high", "dropless", "set_dispatch", {"dispatch": "dropless"},
                                    f"drop fraction {mean:.1%} over the last {len(recent)} steps (limit {limit:.0%}) and "
                                    f"cf_recv {cf_recv} cannot grow past the memory budget; going dropless", rows))
    if probes:
        p = probes[-3:]
        over = all(r["drop_fraction"] > limit for r in p)
        holds = in_force(state, "hold_context_extension")
        releases = in_force(state, "release_context_extension")
        held = len(holds) > len(releases)
        rows = {**ev, "rows": p}
        if over and not held:
            out.append(decision(NAME, state.run_id, "context_extension", f"hold{len(holds)}", "hold_context_extension",
                                {"seq_len": p[-1]["seq_len"]},
                                f"drops at the longer length {p[-1]['seq_len']} are {p[-1]['drop_fraction']:.1%} "
                                f"(limit {limit:.0%}): holding the context extension", rows))
        elif held and not any(r["drop_fraction"] > limit for r in p):
            out.append(decision(NAME, state.run_id, "context_extension", f"release{len(releases)}",
                                "release_context_extension", {"seq_len": p[-1]["seq_len"]},
                                f"drops at the longer length {p[-1]['seq_len']} are back to "
                                f"{p[-1]['drop_fraction']:.1%} (limit {limit:.0%}): releasing the extension", rows))
    return out
