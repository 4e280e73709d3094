"""The learning-rate schedule: a pure function of the step, and the retime a horizon decision makes.

A schedule is a plain dict (it is recorded in `run_started` and replayed from the ledger):
  peak_lr, warmup_steps, horizon_steps, min_lr_ratio, anchor_step, anchor_lr
Three cases, like nanoGPT's get_lr:
  1. warmup: linear from peak/warmup (step 1) to peak (step `warmup_steps`);
  2. decay: linear from peak (or from `anchor_lr` at `anchor_step`, after a retime) down to
     min_lr_ratio * peak at `horizon_steps`;
  3. after the horizon: min_lr_ratio * peak.
Steps are 1-based: step k is the k-th optimizer update. Token horizons convert with tokens_per_step.
"""

from __future__ import annotations

import math

# The fewest decay updates a retimed horizon may leave (from the later of the decision and the end of warmup).
# One is the cliff the refusal exists for: a horizon of warmup + 1 climbs to peak and falls to the floor, 95%
# of peak, in one update. With two or more no update lowers the lr by more than half of the way from where it
# is to the floor, the steepest step a linear decay of the shortest horizons the demo and tests use takes.
MIN_DECAY_STEPS = 2


def make_schedule(peak_lr: float, warmup_steps: int, horizon_steps: int, min_lr_ratio: float = 0.05,
                  tokens_per_step: int | None = None) -> dict:
    sched = {
        "peak_lr": float(peak_lr), "warmup_steps": int(warmup_steps), "horizon_steps": int(horizon_steps),
        "min_lr_ratio": float(min_lr_ratio), "anchor_step": None, "anchor_lr": None,
    }
    if tokens_per_step is not None:
        sched["tokens_per_step"] = int(tokens_per_step)
        sched["horizon_tokens"] = int(horizon_steps) * int(tokens_per_step)
    return sched


def lr_at(step: int, peak_lr: float, warmup_steps: int, horizon_steps: int, min_lr_ratio: float = 0.05,
          anchor_step: int | None = None, anchor_lr: float | None = None, **_ignored) -> float:
    """The learning rate for the `step`-th update (pure: a function of its arguments only)."""
    floor = min_lr_ratio * peak_lr
    if step >= horizon_steps:
        return floor
    if anchor_step is not None and step >= anchor_step:  # retimed: linear from the anchor to the floor
        frac = (step - anchor_step) / max(horizon_steps - anchor_step, 1)
        return anchor_lr + (floor - anchor_lr) * frac
    if step < warmup_steps:
        return peak_lr * max(step, 1) / warmup_steps
    frac = (step - warmup_steps) / max(horizon_steps - warmup_steps, 1)
    return peak_lr + (floor - peak_lr) * frac


def retime(schedule: dict, step: int, horizon_steps: int) -> dict:
    """The schedule after a decision at `step` moves the horizon to `horizon_steps`.

    The lr in force at `step` is kept, and the decay from `step` is re-timed so that it still
    reaches min_lr_ratio * peak exactly at the new horizon. Before the end of warmup only the
    horizon moves (warmup itself is unchanged); a horizon inside warmup, at or before `step`, or leaving
    fewer than MIN_DECAY_STEPS decay updates is refused (the lr would climb, then fall to the floor in one
    step). The new schedule answers for
    steps from `step` on; earlier steps were governed by the schedule in force then (the ledger
    keeps each one).
    """
    if horizon_steps <= step:
        raise ValueError(f"new horizon {horizon_steps} must be after the current step {step}")
    if horizon_steps <= schedule["warmup_steps"]:
        raise ValueError(f"new horizon {horizon_steps} is inside warmup (it ends at step {schedule['warmup_steps']})")
    decay = horizon_steps - max(step, schedule["warmup_steps"])
    if decay < MIN_DECAY_STEPS:
        raise ValueError(f"new horizon {horizon_steps} leaves {decay} decay step{'s' if decay != 1 else ''} after step "
                         f"{max(step, schedule['warmup_steps'])} (warmup ends at step {schedule['warmup_steps']}): "
                         f"fewer than {MIN_DECAY_STEPS}, the lr would fall to the floor in one update")
    new = dict(schedule, horizon_steps=int(horizon_steps))
    if "tokens_per_step" in schedule:
        new["horizon_tokens"] = int(horizon_steps) * int(schedule["tokens_per_step"])
    if step >= schedule["warmup_steps"]:
        new["anchor_step"] = int(step)
        new["anchor_lr"] = float(lr_at(step, **schedule))
    return new


def horizon_steps_for_tokens(horizon_tokens: int, tokens_per_step: int) -> int:
    return max(math.ceil(horizon_tokens / tokens_per_step), 1)
