"""Grad-norm agent: a spike near the latest step (the audit's rule: above grad_norm_median_ratio x the
running median after warmup by default, above grad_norm_max in Marin's profile), or rising → alert."""

from __future__ import annotations

from runledger.agents.policy import Action, alert

NAME = "agent-grad-norm"
EVIDENCE = "evidence/grad_norm"


def decide(state, evidence: list[dict], th: dict) -> list[Action]:
    if not evidence or not evidence[0]["n"]:
        return []
    e = evidence[0]
    ev = {"query": EVIDENCE, "rows": evidence, "ledger_position": state.last_stream_seq}
    out = []
    ratio, median = th["grad_norm_median_ratio"], e["running_median"]
    if th["grad_norm_max"] >= 0 and e["max_grad_norm"] > th["grad_norm_max"]:
        out.append(alert(NAME, state.run_id, "grad_norm_high", e["step"] // 50,
                         f"grad norm {e['max_grad_norm']:.2f} above {th['grad_norm_max']} near step {e['step']}", ev))
    elif (ratio >= 0 and median and e["history"] >= th["grad_norm_min_history"] and e["max_after_warmup"] is not None
          and e["max_after_warmup"] > ratio * median):
        out.append(alert(NAME, state.run_id, "grad_norm_high", e["step"] // 50,
                         f"grad norm {e['max_after_warmup']:.2f} is {e['max_after_warmup'] / median:.1f}x its running "
                         f"median {median:.3g} near step {e['step']} (limit {ratio:g}x)", ev))
    if e["rise"] is not None and e["rise"] > th["grad_norm_rise_max"]:  # the audit's rule, on the latest window
        out.append(alert(NAME, state.run_id, "grad_norm_rising", e["rise_step"] // 50,
                         f"grad norm rose {e['rise']:.0%} of its mean over steps {e['rise_from_step']}-"
                         f"{e['rise_step']} (limit {th['grad_norm_rise_max']:.0%})", ev))
    return out
