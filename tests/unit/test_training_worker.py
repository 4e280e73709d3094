"""The worker: a run interrupted and resumed ends with the same params and losses as an
uninterrupted one; a non-finite loss is skipped, not fatal; a fork records its parent; the lr in
force is the optimizer's; every emitted payload is valid for its kind."""

import dataclasses

from runledger.ledger.contract.validation import check_payload
from runledger.training.config import PRESETS
from runledger.training.decisions import apply_decision

CFG = dataclasses.replace(PRESETS["tiny"], steps=8, eval_every=4, ckpt_every=4, log_every=4)


def test_dispatch_and_capacity_decisions_change_the_config_in_force():
    sched = {"peak_lr": 1e-3, "warmup_steps": 2, "horizon_steps": 8, "min_lr_ratio": 0.05, "anchor_step": None,
             "anchor_lr": None}
    cfg, _, applied, ckpt = apply_decision({"decision_id": "a", "action": "set_capacity_factor", "params": {"cf": 1.5}},
                                           3, CFG, sched)
    assert (cfg.moe.cf_send, cfg.moe.cf_recv) == (1.5, 1.5) and not ckpt
    assert applied["before"]["cf_send"] == 1.1 and applied["after"] == {"dispatch": "capacity", "cf_send": 1.5, "cf_recv": 1.5}
    cfg, _, applied, _ = apply_decision({"decision_id": "b", "action": "set_dispatch", "params": {"dispatch": "dropless"}},
                                        3, cfg, sched)
    assert cfg.moe.dispatch == "dropless" and applied["status"] == "applied"
    _, _, applied, _ = apply_decision({"decision_id": "c", "action": "set_dispatch", "params": {"dispatch": "magic"}},
                                      3, cfg, sched)
    assert applied["status"] == "refused"
    for payload in (applied,):
        check_payload("decision_applied", payload)
