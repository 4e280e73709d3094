"""Decisions at a step boundary: how the worker carries out (or refuses) a contingency decision.

`apply_decision(decision, step, cfg, schedule)` is pure: it returns the config and schedule in force
from `step` on, the `decision_applied` payload (before/after in the shape replay folds: the new
schedule for a horizon, the dispatch fields for dispatch and capacity changes) and whether a
checkpoint was asked for. `ledger_decisions(root, run_id)` is a source of pending decisions for
the loop: it replays the run from the ledger every few seconds and yields each decision that is
ready (`runledger.ledger.contract.decision_state`: decided or approved, not answered) once.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable

from runledger.ledger.contract import decision_state
from runledger.training.config import TrainConfig
from runledger.training.schedule import horizon_steps_for_tokens, retime

WORKER_ACTIONS = ("set_token_horizon", "set_capacity_factor", "set_dispatch", "set_z_loss_weight", "checkpoint_now",
                  "rollback")  # rollback is carried out by the loop itself (it moves the step)


def dispatch_fields(cfg: TrainConfig) -> dict:
    return {"dispatch": cfg.moe.dispatch, "cf_send": float(cfg.moe.cf_send), "cf_recv": float(cfg.moe.cf_recv)}


def with_dispatch(cfg: TrainConfig, fields: dict) -> TrainConfig:
    """The config with dispatch mode and capacity factors replaced (what replay says is in force)."""
    keep = {k: (float(v) if k.startswith("cf_") else v) for k, v in fields.items() if k in ("dispatch", "cf_send", "cf_recv")}
    return dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, **keep)) if keep else cfg


def apply_decision(decision: dict, step: int, cfg: TrainConfig, schedule: dict) -> tuple[TrainConfig, dict, dict, bool]:
    """Carry out `decision` before update `step`; return (cfg, schedule, applied payload, checkpoint?)."""
    action, params = decision["action"], decision.get("params") or {}
    base = {"decision_id": decision["decision_id"], "action": action}

    def refuse(reason: str):
        return cfg, schedule, {**base, "status": "refused", "reason": reason}, False

    try:
        if action == "set_token_horizon":
            if "horizon_steps" in params:
                horizon = int(params["horizon_steps"])
            else:
                horizon = horizon_steps_for_tokens(int(params["horizon_tokens"]), int(schedule["tokens_per_step"]))
            if horizon <= step:
                return refuse(f"horizon step {horizon} is not after the next step {step}")
            if horizon <= int(schedule["warmup_steps"]):
                return refuse(f"horizon step {horizon} is inside warmup (it ends at step {schedule['warmup_steps']}): "
                              "the lr would climb and then fall to the floor in one step")
            new = retime(schedule, step, horizon)
            before = {k: schedule.get(k) for k in new}
            return cfg, new, {**base, "status": "applied", "before": before, "after": new}, False
        if action in ("set_dispatch", "set_capacity_factor"):
            fields = {"dispatch": params["dispatch"]} if action == "set_dispatch" else {
                k: float(params.get(k, params.get("cf"))) for k in ("cf_send", "cf_recv")
                if params.get(k, params.get("cf")) is not None}
            if not fields:
                return refuse("no cf_send, cf_recv or cf given")
            new_cfg = with_dispatch(cfg, fields)
            return new_cfg, schedule, {**base, "status": "applied", "before": dispatch_fields(cfg),
                                       "after": dispatch_fields(new_cfg)}, False
        if action == "set_z_loss_weight":
            weight = params.get("weight", params.get("logit_z_coef"))
            new_cfg = dataclasses.replace(cfg, logit_z_coef=None if weight is None else float(weight))
            return new_cfg, schedule, {**base, "status": "applied", "before": {"logit_z_coef": cfg.logit_z_coef},
                                       "after": {"logit_z_coef": new_cfg.logit_z_coef}}, False
        if action == "checkpoint_now":
            return cfg, schedule, {**base, "status": "applied", "before": {}, "after": {"checkpoint_step": step - 1}}, True
    except (KeyError, TypeError, ValueError) as err:  # MoEConfig refuses an unknown dispatch mode  # a malformed decision is refused, never fatal
        return refuse(f"bad params {params!r}: {err}"[:300])
    return refuse(f"this worker does not carry out {action!r} (it does: {', '.join(WORKER_ACTIONS)})")


def ledger_decisions(root: str | Path, run_id: str, every_s: float = 5.0) -> Callable[[int], list[dict]]:
    """Pending decisions for `run_id` from the ledger, polled at most every `every_s` seconds."""
    from runledger.ledger.check.replay import replay_run

    seen: set[str] = set()
    last = [0.0]

    def poll(_step: int) -> list[dict]:
        now = time.monotonic()
        if now - last[0] < every_s:
            return []
        last[0] = now
        try:
            state = replay_run(root, run_id)
        except (FileNotFoundError, OSError, ValueError):
            return []
        out = decision_state.ready(state.decisions, seen)
        seen.update(d["decision_id"] for d in out)
        return out

    return poll


def feed_decisions(feed) -> Callable[[int], list[dict]]:
    """Pending decisions from a `runledger.ledger.decisions.inbox.DecisionFeed` (live from NATS), each handed out once."""

    def take(_step: int) -> list[dict]:
        ready = feed.ready()
        for d in ready:
            feed.mark_applied(d["decision_id"])
        return ready

    return take
