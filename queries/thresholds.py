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

Two forms of every rule (issue 43). The default is relative to the run's own history and measured
noise, and is what any run gets; Marin's absolute rules (for an 8B-535B LLM with a per-token loss)
are a named health profile a run opts into (`runledger.init(health="marin")`, recorded as the config
key "health"; `marin-2024` is Marin's older eval rule on top of `marin`). A threshold's `profiles`
give its value in a profile; a negative value turns that form of a check off (OFF), so that each
profile reads one form: e.g. grad_norm_max is OFF by default and 2.0 under "marin", and
grad_norm_median_ratio the other way round. A run's own thresholds win over its profile.

The loss's unit (issue 43, item 13): a run declares what its loss is averaged over (`init(loss_unit=)`,
the config key "loss_unit": per token, per byte, per sample, other; or nothing). Marin's absolute loss
numbers (`per_token`: the loss-floor rise, the trend's rise, the spike's 0.05 minimum) are nats per
token of an LLM's tokenizer, so they judge only a loss declared per token; a per-byte loss that declares
its tokenizer's bytes per token (config "bytes_per_token") gets them converted (divided by it); any
other loss gets the default relative form of those checks (the thresholds marked `loss_form` take their
default values), and the audit row says which in its evidence's "loss_unit" line. A run's own
thresholds are in its own unit and are never converted.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PROFILE = "default"
PROFILES = (DEFAULT_PROFILE, "marin", "marin-2024")
PARENTS = {"marin-2024": ("marin",)}  # a profile's values fall back to these before the default
OFF = -1.0  # a form of a check whose threshold is negative does not run
LOSS_UNITS = ("token", "byte", "sample", "other")  # what a run's loss is averaged over (config "loss_unit")
MARIN = "Marin alert (infra/grafana hero_health.py): "


@dataclass(frozen=True)
class Threshold:
    name: str
    default: float
    unit: str
    anchor: str
    read_by: tuple[str, ...]
    formerly: str | None = None
    profiles: tuple[tuple[str, float], ...] = ()  # (profile, value) where the profile differs from the default
    rule: str = ""  # Marin's rule, for docs/health.md, where the threshold is one form of it
    per_token: bool = False  # an absolute loss in nats per token (converted for a per-byte loss)
    loss_form: bool = False  # picks a loss check's form: its default value unless the loss is per token (or converts)

    def value(self, profile: str = DEFAULT_PROFILE) -> float:
        """The threshold in `profile` (marin-2024 is marin's values with its own on top)."""
        given = dict(self.profiles)
        for p in (profile, *PARENTS.get(profile, ())):
            if p in given:
                return given[p]
        return self.default


RULE_BOOK: tuple[Threshold, ...] = (
    Threshold("grad_norm_max", OFF, "grad norm",
              "runledger: off by default (Marin's 2.0 is for an 8B LLM; a small run's pre-clip norm is 10-13 in warmup)",
              ("health/grad_norm_spike", "agents/grad_norm"), profiles=(("marin", 2.0),),
              rule=MARIN + "grad norm > 2.0"),
    Threshold("grad_norm_median_ratio", 7.0, "x the running median",
              "runledger: a step's grad norm above 7x the median of the attempt's grad norms before it, after "
              "warmup (healthy small runs: at most 3.2x over 20 seeds, bench/health.py)",
              ("health/grad_norm_spike", "agents/grad_norm"), profiles=(("marin", OFF),)),
    Threshold("grad_norm_min_history", 10.0, "steps",
              "runledger: the running median needs this many steps after warmup before it judges",
              ("health/grad_norm_spike", "agents/grad_norm")),
    Threshold("grad_norm_rise_max", 0.5, "fraction of the window's mean",
              "Marin checklist: grad-norm rate of change; runledger: rising > 50% across the trailing window",
              ("health/grad_norm_trend", "agents/grad_norm")),
    Threshold("grad_norm_rise_t", 5.0, "t statistic",
              "runledger: ...and the rise stands out of the grad norm's noise: the slope's t statistic above 5 (healthy "
              "small runs: at most 3.6 in a window that rose > 50%, 20 seeds; a 5-step window's slope is mostly noise)",
              ("health/grad_norm_trend",), profiles=(("marin", OFF),)),
    Threshold("drop_fraction_max", OFF, "fraction of assignments",
              "runledger: off by default (Marin's 7% is for its MoE; the toy MoE at capacity drops 20-58% of "
              "its assignments on a healthy run, 20 small seeds)",
              ("health/drop_fraction",), profiles=(("marin", 0.07),), rule=MARIN + "drop fraction > 7%"),
    Threshold("drop_fraction_sigma", 6.0, "drop noise (sigma)",
              "runledger: a step's drop fraction above the median of the attempt's steps before it (>= 5 of them) by "
              "> 6 sigma of its step-to-step noise (a robust sigma, as loss_noise); healthy small and tiny runs: at "
              "most 3.2 sigma over 24 seeds", ("health/drop_fraction",), profiles=(("marin", OFF),)),
    Threshold("drop_fraction_min_rise", 0.01, "fraction of assignments",
              "runledger: ...and above it by more than 1 percentage point (as drops_vs_ladder_min_diff)",
              ("health/drop_fraction",)),
    Threshold("drop_fraction_settle_warmups", 2.0, "warmups",
              "runledger: drops are judged from this many warmup lengths on (as the router entropy: a small run's "
              "drops climb to 45-60% in warmup and settle after the lr peak)", ("health/drop_fraction",)),
    Threshold("drop_fraction_agent_max", 0.07, "fraction of assignments",
              "Marin alert: drop fraction > 7%; the drop agent raises the capacity factor (or holds a context "
              "extension) over it, in every profile: a decision, not a health verdict", ("agents/drops",)),
    Threshold("drops_vs_ladder_ratio", 2.0, "ratio",
              "runledger: drop fraction > 2x the ladder rungs at the same fraction of training",
              ("health/drops_vs_ladder",)),
    Threshold("drops_vs_ladder_min_diff", 0.01, "fraction of assignments",
              "runledger: ...and above them by more than 1 percentage point", ("health/drops_vs_ladder",)),
    Threshold("loss_floor_rise_max", OFF, "loss",
              "runledger: off by default (1.0 is a per-token anchor; on a per-byte loss it misses a 12% rise)",
              ("health/loss_floor",), profiles=(("marin", 1.0),),
              rule="Marin checklist: loss floor more than 1.0 above the trailing floor",
              per_token=True, loss_form=True),
    Threshold("loss_floor_sigma", 8.0, "loss noise (sigma)",
              "runledger: a block's lowest loss above the lowest before it by > 8 sigma of the run's per-step loss "
              "noise (a block's min sits a few sigma above the trailing min on a flat healthy loss)",
              ("health/loss_floor",), profiles=(("marin", OFF),), loss_form=True),
    Threshold("loss_rise_max", OFF, "loss",
              "runledger: off by default (0.05 is about one standard deviation of the statistic on a small run: "
              "20 of 20 healthy runs warned)", ("health/loss_trend",), profiles=(("marin", 0.05),),
              rule="runledger's former default: mean loss of a window above the previous window by > 0.05",
              per_token=True, loss_form=True),
    Threshold("loss_rise_sigma", 3.0, "standard errors",
              "runledger: a window's mean loss above the previous window's by > 3 standard errors of that "
              "difference (sigma x sqrt(2/n), sigma the run's per-step loss noise; healthy small runs: at most 2.3 "
              "over 20 seeds)",
              ("health/loss_trend",), profiles=(("marin", OFF),), loss_form=True),
    Threshold("loss_spike_sigma", 10.0, "loss noise (sigma)",
              "runledger: a step's loss above the median of the loss_spike_baseline_steps before it by > 10 sigma "
              "of the per-step noise at its sequence length, a robust sigma (healthy small runs: at most 3.5 over 20 seeds; heavy-tailed "
              "synthetic noise reaches 8; Levanter skips a step at 6 sigma of a window's own, non-robust, spread)",
              ("health/loss_spike",), profiles=(("marin", OFF),), loss_form=True),
    Threshold("loss_spike_baseline_steps", 20.0, "steps",
              "Marin alert: at least 20 baseline samples", ("health/loss_spike",)),
    Threshold("loss_spike_marin_sigma", OFF, "sigma of the baseline",
              "runledger: off by default (a time-windowed rule for a run logging every few seconds)",
              ("health/loss_spike",), profiles=(("marin", 6.0),),
              rule=MARIN + "over the last hour but 5 min, the recent 5-min floor of the loss above the baseline "
                           "mean + max(0.05, 6 sigma), >= 20 baseline and >= 5 recent samples", loss_form=True),
    Threshold("loss_spike_min_rise", 0.05, "loss", "Marin alert: max(0.05, 6 sigma)", ("health/loss_spike",),
              per_token=True, loss_form=True),
    Threshold("loss_spike_recent_s", 300.0, "s", "Marin alert: the recent 5-min floor", ("health/loss_spike",)),
    Threshold("loss_spike_baseline_s", 3600.0, "s", "Marin alert: the last hour (but the recent 5 min)",
              ("health/loss_spike",)),
    Threshold("loss_spike_recent_min", 5.0, "samples", "Marin alert: at least 5 recent samples",
              ("health/loss_spike",)),
    Threshold("nonfinite_loss_max", 0.0, "steps", "Marin/Levanter: a NaN or infinite loss is never healthy",
              ("health/nonfinite_loss",), rule=MARIN + "loss is NaN or infinite"),
    Threshold("eval_rise_last_max", OFF, "fraction of the last eval",
              "runledger: off by default (an eval is noisy: see eval_noise_sigma)", ("health/eval_regression",),
              profiles=(("marin", 0.0), ("marin-2024", 0.02)),
              rule=MARIN + "the newest eval worse than the previous one (marin-2024: > 2% worse)"),
    Threshold("eval_rise_two_ago_max", OFF, "fraction of the eval two ago",
              "runledger: off unless marin-2024", ("health/eval_regression",), profiles=(("marin-2024", 0.0),),
              rule="Marin's older alert (marin-2024): eval worse than two evals ago"),
    Threshold("eval_noise_sigma", 2.0, "eval noise (sigma)",
              "runledger: the newest eval worse than the previous by > 2 sigma of an eval-to-eval change, measured "
              "on the evals before it (from the MAD of their second differences, robust to the trend)",
              ("health/eval_regression",), profiles=(("marin", OFF),)),
    Threshold("eval_min_count", 5.0, "evals", "runledger: the eval noise is measured on at least 5 evals before it",
              ("health/eval_regression",)),
    Threshold("router_entropy_min_ratio", 0.5, "fraction of ln E",
              "runledger: a block's mean router entropy below 50% of ln E from twice the warmup on (healthy runs dip: "
              "the small preset to 0.63 ln E in warmup, the tiny one to 0.59 ln E at 2-4 warmups, both back above "
              "0.88 by step ~30; 20 + 4 seeds)",
              ("health/router_entropy",),
              profiles=(("marin", 0.995),), rule=MARIN + "router entropy below 0.995 ln E (5.92 for 384 experts)"),
    Threshold("router_entropy_drop_ratio", 0.95, "fraction of the running median",
              "runledger: ...or below 95% of the median of the blocks before it (a fall from the run's own level; "
              "healthy small and tiny runs: at least 0.98 of it from twice the warmup on, 24 seeds; 0.8 ln E from a "
              "level of 0.88-0.98 is at most 0.91 of it)...",
              ("health/router_entropy",), profiles=(("marin", OFF),)),
    Threshold("router_entropy_drop_sigma", 6.0, "block noise (sigma)",
              "runledger: ...by more than 6 sigma of the block-to-block noise (a robust sigma, as loss_noise): healthy "
              "small and tiny runs fall at most 3.0 sigma under their running median, 24 seeds; a noisy run's 5% dip "
              "is no fall", ("health/router_entropy",), profiles=(("marin", OFF),)),
    Threshold("router_entropy_settle_warmups", 2.0, "warmups",
              "runledger: the router entropy is judged from this many warmup lengths on (the router settles after "
              "the lr peak); Marin's profile judges from the first step", ("health/router_entropy",),
              profiles=(("marin", 0.0),), rule=MARIN + "router entropy judged at every sample"),
    Threshold("router_bias_max", OFF, "|bias|", "runledger: off by default (an absolute size for Marin's router)",
              ("health/router_bias",), profiles=(("marin", 400.0),), rule=MARIN + "|router bias| > 400"),
    Threshold("router_bias_median_ratio", 10.0, "x the running median",
              "runledger: a step's max |router bias| above 10x the median of the attempt's before it",
              ("health/router_bias",), profiles=(("marin", OFF),)),
    Threshold("param_norm_growth_max", 0.25, "fraction",
              "runledger: parameter norm growing > 25% across the trailing window", ("health/param_norm_growth",)),
    Threshold("mfu_below_plan_tol", OFF, "fraction of the plan",
              "runledger: off by default (a plan's peak is often made up: the small preset on CPU plans against 1e11 "
              "FLOP/s and 6 of 20 healthy runs fell under it)", ("health/mfu_plan",),
              profiles=(("marin", 0.05),), rule=MARIN + "MFU below plan (5% slack for timing noise)"),
    Threshold("mfu_below_own_tol", 0.05, "fraction of the run's own rate",
              "runledger: a block's rate (its FLOP rate, else tokens/s, else MFU) below the median of the run's blocks "
              "before it (>= 5 of them: the rate the run has shown it can do) by > 5%...",
              ("health/mfu_plan",), profiles=(("marin", OFF),)),
    Threshold("mfu_below_plan_sigma", 6.0, "robust CVs / sqrt(n)",
              "runledger: ...and by more than 6x the run's step-to-step spread of its rate over sqrt of the block's "
              "steps (a robust CV; healthy small and tiny runs on a shared CPU: at most 4.1 over 24 seeds, 1-step "
              "blocks)", ("health/mfu_plan",), profiles=(("marin", OFF),)),
    Threshold("mfu_variation_sigma", 10.0, "robust CVs / sqrt(n)",
              "runledger: ...and off by more than 10x the run's own step-to-step spread (a robust coefficient of "
              "variation, over sqrt of the block's steps): on a shared CPU a small run's MFU has a CV of 0.3-0.4 and "
              "single steps at 4-5x its median (20 seeds, 1-step blocks)",
              ("health/mfu_constant",), profiles=(("marin", OFF),)),
    Threshold("mfu_variation_max", 0.2, "fraction of the run median",
              'runledger: a window\'s MFU > 20% off the run median ("MFU constant")', ("health/mfu_constant",)),
    Threshold("lr_rel_tol", 0.001, "fraction of peak lr", "runledger: lr off the recomputed schedule by > 0.1% of peak",
              ("views/lr_segments", "health/lr_schedule")),
    Threshold("silence_max_s", 600.0, "s", "Marin alert: telemetry silent > 10 min",
              ("health/telemetry_silence", "views/silence_bucket", "agents/telemetry", "health/telemetry_gone")),
    Threshold("stall_factor", 10.0, "median step gaps",
              "runledger: a running run with no step for 10x its median step gap is stalled (wandb#8592: a "
              "watchdog on stalled runs); an eval or a checkpoint save takes a few gaps, not ten", ("agents/stall",)),
    Threshold("stall_min_s", 120.0, "s",
              "runledger: ...and for at least 2 min, so that a fast run's pause (GC, a checkpoint) is no stall",
              ("agents/stall", "health/telemetry_gone")),
    Threshold("throughput_floor_ratio", 0.7, "fraction of the run median",
              "runledger: the floor is 70% of the median MFU (else tokens/s) of the samples before the window (else of "
              "those a window after it, else of the run), each attempt's first step left out (a sample at half the rate with 25% jitter is under it 9 "
              "times in 10; a healthy one, 1 in 13; at 75% two more of 24 real CPU runs on a loaded machine fail)", ("health/throughput_floor",),
              profiles=(("marin", OFF),)),
    Threshold("throughput_plan_floor", OFF, "fraction of the plan",
              "runledger: off by default (a run logged by hand has no plan)", ("health/throughput_floor",),
              profiles=(("marin", 0.95),), rule=MARIN + "MFU/throughput below the floor in most samples of 15 min"),
    Threshold("throughput_skip_steps", 10.0, "steps",
              "runledger: each attempt's first 10 steps are warm-up, not judged (a tiny run's first 10 steps on CPU "
              "run at a third of its rate while JAX compiles)", ("health/throughput_floor",)),
    Threshold("throughput_smooth_samples", 5.0, "steps",
              "runledger: a sample is the median of 5 consecutive steps' rates centred on it (with 25% jitter a step "
              "at half the rate is under a 70% floor 9 times in 10 and a healthy one 1 in 13, so a dip over 60% of a "
              "window filled 57% of it; the median of 5: 99 and 1 in 100); Marin's profile counts each step's own",
              ("health/throughput_floor",), profiles=(("marin", 1.0),),
              rule=MARIN + "each sample counted as it is"),
    Threshold("throughput_window_s", 900.0, "s", "Marin alert: 15 minutes", ("health/throughput_floor",)),
    Threshold("throughput_min_samples", 10.0, "samples", "Marin alert: at least 10 samples in the window",
              ("health/throughput_floor",)),
    Threshold("throughput_below_share", 0.5, "fraction of samples",
              "Marin alert: more than half of them below the floor (one restart step cannot trip it)",
              ("health/throughput_floor",)),
    Threshold("init_max_s", 2700.0, "s", "Marin alert: no first step 45 min after start",
              ("health/still_initializing",), rule=MARIN + "no first step 45 min after start"),
    Threshold("silence_gap_factor", 10.0, "median step gaps",
              "runledger: telemetry gone when silent for 10x the run's median step gap (at least stall_min_s) while "
              "its heartbeat goes on", ("health/telemetry_gone",), profiles=(("marin", OFF),)),
    Threshold("resume_loss_abs_max", 0.002, "loss",
              "Marin protocol (cutover): a replayed step's loss within 0.002 of the attempt before (a free "
              "determinism check); the same in both forms", ("health/resume_matches",),
              rule="Marin protocol (by hand): a resumed run's replayed loss within 0.002 / 1%"),
    Threshold("resume_loss_rel_max", 0.01, "fraction of the loss",
              "Marin protocol: ...and within 1% after warmup", ("health/resume_matches",)),
    Threshold("checkpoint_gap_factor", 2.0, "planned intervals",
              "runledger: no complete checkpoint within 2x the planned interval (config.ckpt_every, else the "
              "run's median gap)", ("health/checkpoints_advancing",)),
    Threshold("compute_gpai_flop", 1e23, "FLOP",
              "EU AI Act: 10^23 training FLOP, the general-purpose model presumption (Commission guidelines)",
              ("health/compute_thresholds",)),
    Threshold("compute_systemic_flop", 1e25, "FLOP", "EU AI Act art. 51(2): 10^25 FLOP, systemic risk",
              ("health/compute_thresholds",)),
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


def check_profile(profile: str) -> str:
    """`profile` if it is a health profile, else a ValueError naming them."""
    if profile not in PROFILES:
        raise ValueError(f"unknown health profile {profile!r} (profiles: {', '.join(PROFILES)})")
    return profile


def check_loss_unit(unit: str) -> str:
    """`unit` if it is a loss unit, else a ValueError naming them."""
    if unit not in LOSS_UNITS:
        raise ValueError(f"unknown loss unit {unit!r} (units: {', '.join(LOSS_UNITS)})")
    return unit


def _sql_str(s: str | None) -> str:
    return "NULL" if s is None else "'" + s.replace("'", "''") + "'"


def values_sql() -> str:
    """The rows of views.sql's threshold_defaults: (name, value, unit, anchor, formerly, per_token, loss_form)."""
    return ",\n    ".join(f"({_sql_str(t.name)}, {t.default!r}, {_sql_str(t.unit)}, {_sql_str(t.anchor)}, "
                          f"{_sql_str(t.formerly)}, {t.per_token}, {t.loss_form})" for t in RULE_BOOK)


def profiles_sql() -> str:
    """The rows of views.sql's threshold_profiles: (profile, name, value), for every threshold a profile
    other than the default sets differently."""
    rows = [(p, t.name, t.value(p)) for p in PROFILES[1:] for t in RULE_BOOK if t.value(p) != t.default]
    return ",\n    ".join(f"({_sql_str(p)}, {_sql_str(n)}, {v!r})" for p, n, v in rows)
