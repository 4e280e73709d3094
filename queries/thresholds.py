"""The rule book's numbers: every threshold an agent or an audit check reads, defined once.

Each has a name, a default, a unit, the anchor it comes from (DESIGN.md, "Numbers from the anchors",
or `runledger:` where the number is this project's choice) and its readers: the health checks
(`health/...`), the agents' evidence queries (`evidence/...`), the views of views.sql (`views/...`)
and the agents (`agents/...`) that name it (tests/{unit,integration}/test_thresholds.py checks the list against them).
views.sql's `threshold_defaults` is rendered from this table, and its `run_thresholds` (the defaults,
overridden by name in the run's latest run_started.thresholds) is what the audit and the agents
read, so a run's overrides win for both. `formerly` is an older name a run may still set: it is
honoured where the new name is not set (`window_steps` meant both block_steps and
agent_window_steps).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Threshold:
    name: str
    default: float
    unit: str
    anchor: str
    read_by: tuple[str, ...]
    formerly: str | None = None


RULE_BOOK: tuple[Threshold, ...] = (
    Threshold("grad_norm_max", 2.0, "grad norm", "Marin alert: grad norm > 2.0",
              ("health/grad_norm_spike", "agents/grad_norm")),
    Threshold("grad_norm_rise_max", 0.5, "fraction of the window's mean",
              "Marin checklist: grad-norm rate of change; runledger: rising > 50% across the trailing window",
              ("health/grad_norm_trend", "agents/grad_norm")),
    Threshold("drop_fraction_max", 0.07, "fraction of assignments", "Marin alert: drop fraction > 7%",
              ("health/drop_fraction", "agents/drops")),
    Threshold("drops_vs_ladder_ratio", 2.0, "ratio",
              "runledger: drop fraction > 2x the ladder rungs at the same fraction of training",
              ("health/drops_vs_ladder",)),
    Threshold("drops_vs_ladder_min_diff", 0.01, "fraction of assignments",
              "runledger: ...and above them by more than 1 percentage point", ("health/drops_vs_ladder",)),
    Threshold("loss_floor_rise_max", 1.0, "loss", "Marin checklist: loss floor more than 1.0 above the trailing floor",
              ("health/loss_floor",)),
    Threshold("loss_rise_max", 0.05, "loss", "runledger: mean loss of a window above the previous window by > 0.05",
              ("health/loss_trend",)),
    Threshold("eval_rise_last_max", 0.02, "fraction of the last eval", "Marin alert: eval > 2% worse than the last",
              ("health/eval_regression",)),
    Threshold("eval_rise_two_ago_max", 0.0, "fraction of the eval two ago",
              "Marin alert: eval worse than two evals ago",
              ("health/eval_regression",)),
    Threshold("router_entropy_min_ratio", 0.9, "fraction of ln E",
              'runledger: router entropy below 90% of ln E ("near max")', ("health/router_entropy",)),
    Threshold("param_norm_growth_max", 0.25, "fraction",
              "runledger: parameter norm growing > 25% across the trailing window", ("health/param_norm_growth",)),
    Threshold("mfu_below_plan_tol", 0.05, "fraction of the plan",
              "Marin alert: MFU below plan (5% slack for timing noise)", ("health/mfu_plan",)),
    Threshold("mfu_variation_max", 0.2, "fraction of the run median",
              'runledger: a window\'s MFU > 20% off the run median ("MFU constant")', ("health/mfu_constant",)),
    Threshold("lr_rel_tol", 0.001, "fraction of peak lr", "runledger: lr off the recomputed schedule by > 0.1% of peak",
              ("views/lr_segments", "health/lr_schedule")),
    Threshold("silence_max_s", 600.0, "s", "Marin alert: telemetry silent > 10 min",
              ("health/telemetry_silence", "views/silence_bucket", "agents/telemetry")),
    Threshold("stall_factor", 10.0, "median step gaps",
              "runledger: a running run with no step for 10x its median step gap is stalled (wandb#8592: a "
              "watchdog on stalled runs); an eval or a checkpoint save takes a few gaps, not ten", ("agents/stall",)),
    Threshold("stall_min_s", 120.0, "s",
              "runledger: ...and for at least 2 min, so that a fast run's pause (GC, a checkpoint) is no stall",
              ("agents/stall",)),
    Threshold("skipped_steps_max", 3.0, "steps", "Marin alert: >= 3 skipped steps in 15 min",
              ("health/skipped_steps", "agents/skipped")),
    Threshold("skipped_window_s", 900.0, "s", "Marin alert: the 15 min window for skipped steps",
              ("health/skipped_steps", "agents/runner", "agents/skipped")),
    Threshold("block_steps", 0.0, "steps", "runledger: the audit's steps per block; 0 = 1% of the horizon",
              ("views/run_blocks",), formerly="window_steps"),
    Threshold("window_blocks", 5.0, "blocks", "runledger: blocks in a trailing window (5% of training by default)",
              ("health/loss_trend", "health/param_norm_growth", "health/grad_norm_trend", "evidence/grad_norm")),
    Threshold("agent_window_steps", 10.0, "steps", "runledger: the trailing window of steps the agents look at",
              ("agents/runner", "agents/drops", "agents/throughput"), formerly="window_steps"),
    Threshold("contingency_fraction", 0.25, "fraction of the token horizon",
              "Contingency: the first ~25% of the token budget", ("agents/throughput",)),
    Threshold("throughput_tolerance", 0.10, "fraction of the time budget",
              "runledger: a shortfall under 10% is noise, not a contingency", ("agents/throughput",)),
    Threshold("max_capacity_factor", 2.0, "capacity factor",
              "runledger: the memory budget for capacity buffers (cf_recv)",
              ("agents/drops",)),
    Threshold("capacity_factor_step", 1.5, "ratio",
              "Token-drop alternatives: raise capacity factor (by this much per set_capacity_factor)",
              ("agents/drops",)),
    Threshold("fork_window_steps", 0.0, "steps",
              "runledger: the fork audit's window, the last N steps a fork and its parent both logged after the fork "
              "point; 0 = all of them", ("views/fork_window",)),
    Threshold("fork_loss_delta_max", 0.02, "loss (nats)",
              "runledger: a code cutover's go/no-go (Marin runs a fork beside the main run): the fork's mean loss over "
              "the window above its parent's by > 0.02, under half the 0.05 of a Marin loss spike", ("fork/loss_delta",)),
    Threshold("fork_mfu_drop_max", 0.05, "fraction of the parent's MFU",
              "Marin checklist: MFU constant; a fork's mean MFU below its parent's by > 5% (the slack of mfu_below_plan_tol)",
              ("fork/mfu",)),
    Threshold("fork_drop_fraction_rise_max", 0.01, "fraction of assignments",
              "Marin alert: drop fraction; a fork's mean above its parent's by > 1 percentage point (as drops_vs_ladder)",
              ("fork/drop_fraction",)),
)

THRESHOLDS: dict[str, Threshold] = {t.name: t for t in RULE_BOOK}
DEFAULTS: dict[str, float] = {t.name: t.default for t in RULE_BOOK}
NAMES = frozenset(THRESHOLDS) | {t.formerly for t in RULE_BOOK if t.formerly}  # what a run may set


def _sql_str(s: str | None) -> str:
    return "NULL" if s is None else "'" + s.replace("'", "''") + "'"


def values_sql() -> str:
    """The rows of views.sql's threshold_defaults: (name, value, unit, anchor, formerly)."""
    return ",\n    ".join(f"({_sql_str(t.name)}, {t.default!r}, {_sql_str(t.unit)}, {_sql_str(t.anchor)}, "
                          f"{_sql_str(t.formerly)})" for t in RULE_BOOK)
