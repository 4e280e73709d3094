-- The ledger's SQL views (DESIGN.md, SQL views). `{{kind:NAME}}` is replaced by the loader with a scan
-- of that kind's Parquet files (or an empty relation of the same columns when there are none yet);
-- `{{quarantine}}` likewise. Every view is derived from the stored events; nothing here writes.

-- every event of every kind: the envelope columns and the canonical payload text
create or replace view events as
{{all_kinds}};

-- one row per (run, producer attempt) that started: config, budget, schedule, thresholds
create or replace view runs as
select * from {{kind:run_started}};

-- every step of every attempt (a resumed run re-does the steps after its checkpoint)
create or replace view steps_all as
select * from {{kind:step}};

-- one row per (run_id, step): the latest attempt's
create or replace view steps as
select * from steps_all
qualify row_number() over (partition by run_id, step order by attempt desc, seq desc) = 1;

-- token drops at the length the run trains at, one row per step and attempt
create or replace view drops as
select * from {{kind:drops}} where not coalesce(probe, false);

-- drops measured at a longer length ahead of a context extension (no update was made)
create or replace view drop_probes as
select * from {{kind:drops}} where coalesce(probe, false);

create or replace view evals as
select * from {{kind:eval}};

create or replace view checkpoints as
select * from {{kind:checkpoint}};

create or replace view data as
select * from {{kind:data}};

create or replace view forecasts as
select * from {{kind:forecast}};

create or replace view alerts as
select * from {{kind:alert}};

create or replace view decisions as
select * from {{kind:decision}};

create or replace view decisions_applied as
select * from {{kind:decision_applied}};

create or replace view runs_finished as
select * from {{kind:run_finished}};

-- input the ledger refused, with the raw bytes, the subject and the reason
create or replace view quarantine as
select * from {{quarantine}};

-- ---------------------------------------------------------------------------------------------
-- Audit helpers (queries/health, provenance, forecast). `audit.py` materialises the small ones
-- (run_plan, run_thresholds, step_blocks) as temp tables of the same name before a suite runs,
-- so each check reads them once; run alone through `runledger sql` they are plain views.
-- ---------------------------------------------------------------------------------------------

-- every run the ledger knows of, whatever kinds it has (an audit reports on each, skipping what is
-- absent); from the partition directories' names, so no file is opened
create or replace view audit_runs as
select distinct regexp_extract(file, '/run_id=([^/]+)/[^/]*$', 1) as run_id
from glob({{events_glob}});

-- what each run declared in its first run_started: budget, schedule, experts, plan; one row per run.
-- horizon_steps: the schedule's, else its token horizon, else the token budget, in steps (rounded up,
-- as training/schedule.horizon_steps_for_tokens does); min_lr_ratio defaults to 0.05 (Marin: decay
-- to 5% of peak).
create or replace view run_plan as
with first_start as (
    select * from runs
    qualify row_number() over (partition by run_id order by attempt, ts, seq) = 1
), latest_start as (
    select run_id, thresholds from runs
    qualify row_number() over (partition by run_id order by attempt desc, ts desc, seq desc) = 1
), parsed as (
    select
        f.run_id, f.token_budget, f.config, f.config_hash, f.schedule, f.planned_tokens_per_s,
        l.thresholds,
        coalesce((f.schedule ->> 'tokens_per_step')::bigint, f.tokens_per_step) as tokens_per_step,
        (f.schedule ->> 'peak_lr')::double as peak_lr,
        coalesce((f.schedule ->> 'warmup_steps')::bigint, 0) as warmup_steps,
        coalesce((f.schedule ->> 'min_lr_ratio')::double, 0.05) as min_lr_ratio,
        (f.schedule ->> 'horizon_steps')::bigint as schedule_horizon_steps,
        (f.schedule ->> 'horizon_tokens')::bigint as horizon_tokens,
        (f.schedule ->> 'anchor_step')::bigint as anchor_step,
        (f.schedule ->> 'anchor_lr')::double as anchor_lr,
        coalesce((f.config -> 'moe' ->> 'n_experts')::bigint, (f.config ->> 'n_experts')::bigint) as n_experts,
        (f.config ->> 'planned_mfu')::double as planned_mfu
    from first_start f join latest_start l using (run_id)
)
select
    *,
    coalesce(schedule_horizon_steps, ceil(horizon_tokens / tokens_per_step)::bigint,
             ceil(token_budget / tokens_per_step)::bigint) as horizon_steps
from parsed;

-- the default thresholds, with the anchor each comes from; a run overrides any of them by name in
-- its run_started.thresholds
create or replace view threshold_defaults as
select * from (values
    ('grad_norm_max', 2.0, 'Marin alert: grad norm > 2.0'),
    ('grad_norm_rise_max', 0.5, 'runledger: grad norm rising > 50% across the trailing window (regr_slope)'),
    ('drop_fraction_max', 0.07, 'Marin alert: drop fraction > 7%'),
    ('drops_vs_ladder_ratio', 2.0, 'runledger: drop fraction > 2x the ladder rungs at the same fraction of training'),
    ('drops_vs_ladder_min_diff', 0.01, 'runledger: ...and above them by more than 1 percentage point'),
    ('loss_floor_rise_max', 1.0, 'Marin checklist: loss floor more than 1.0 above the trailing floor'),
    ('loss_rise_max', 0.05, 'runledger: mean loss of a window above the previous window by > 0.05'),
    ('eval_rise_last_max', 0.02, 'Marin alert: eval > 2% worse than the last'),
    ('eval_rise_two_ago_max', 0.0, 'Marin alert: eval worse than two evals ago'),
    ('router_entropy_min_ratio', 0.9, 'runledger: router entropy below 90% of ln E ("near max")'),
    ('param_norm_growth_max', 0.25, 'runledger: parameter norm growing > 25% across the trailing window'),
    ('mfu_below_plan_tol', 0.05, 'Marin alert: MFU below plan (5% slack for timing noise)'),
    ('mfu_variation_max', 0.2, 'runledger: a window''s MFU > 20% off the run median ("MFU constant")'),
    ('lr_rel_tol', 0.001, 'runledger: lr off the recomputed schedule by > 0.1% of peak'),
    ('silence_max_s', 600.0, 'Marin alert: telemetry silent > 10 min'),
    ('skipped_steps_max', 3.0, 'Marin alert: >= 3 skipped steps in 15 min'),
    ('skipped_window_s', 900.0, 'Marin alert: the 15 min window for skipped steps'),
    ('window_steps', 0.0, 'runledger: steps per block; 0 = 1% of the horizon'),
    ('window_blocks', 5.0, 'runledger: blocks in a trailing window (5% of training by default)')
) as t(name, value, anchor);

-- the thresholds in force for each run: the defaults, overridden by run_started.thresholds
create or replace view run_thresholds as
select
    r.run_id, d.name,
    coalesce(json_extract(p.thresholds, '$.' || d.name)::double, d.value) as value,
    case when json_extract(p.thresholds, '$.' || d.name) is null then d.anchor else 'run_started.thresholds' end as source
from audit_runs r
cross join threshold_defaults d
left join run_plan p using (run_id);

-- the other runs of each run's ladder: the same run_started.ladder name, or the rungs a forecast for it used
create or replace view ladder_peers as
select distinct a.run_id, b.run_id as peer
from runs a
join runs b on coalesce(b.ladder ->> 'name', b.ladder ->> 'ladder') = coalesce(a.ladder ->> 'name', a.ladder ->> 'ladder')
where b.run_id <> a.run_id
union
select distinct target_run as run_id, unnest(from_json(rungs, '["VARCHAR"]')) as peer
from forecasts;

-- steps per block for each run: window_steps if set, else 1% of the horizon, else 100
create or replace view run_blocks as
select
    a.run_id,
    greatest(1, coalesce(nullif(w.value, 0)::bigint, p.horizon_steps // 100, 100)) as block_steps
from audit_runs a
left join run_plan p using (run_id)
left join run_thresholds w on w.run_id = a.run_id and w.name = 'window_steps';

-- per (run, attempt, block of `block_steps` steps): the sufficient statistics the health checks
-- need (counts, sums for regr_slope, extremes, first/last), so that a check over a 400k-step run
-- reads a few hundred rows; block_steps is window_steps, or 1% of the horizon, or 100.
create or replace view step_blocks as
select
    s.run_id, s.attempt, (s.step - 1) // z.block_steps as block, any_value(z.block_steps) as block_steps,
    count(*) as n, min(s.step) as step_lo, max(s.step) as step_hi,
    sum(s.tokens) as tokens,
    count(s.grad_norm) as g_n, sum(s.grad_norm) as g_sy, max(s.grad_norm) as g_max,
    sum(s.step::double) filter (s.grad_norm is not null) as g_sx,
    sum(s.step::double * s.step) filter (s.grad_norm is not null) as g_sxx,
    sum(s.step * s.grad_norm) as g_sxy,
    count(s.loss) as l_n, sum(s.loss) as l_sy, min(s.loss) as l_min,
    count(s.param_norm) as p_n, arg_min(s.param_norm, s.step) filter (s.param_norm is not null) as p_first,
    arg_max(s.param_norm, s.step) filter (s.param_norm is not null) as p_last,
    count(s.router_entropy) as re_n, avg(s.router_entropy) as re_mean,
    count(s.mfu) as mfu_n, avg(s.mfu) as mfu_mean,
    count(s.tokens_per_s) as tps_n, avg(s.tokens_per_s) as tps_mean
from steps_all s
join run_blocks z using (run_id)
where s.step is not null
group by s.run_id, s.attempt, (s.step - 1) // z.block_steps;

-- training/schedule.lr_at in SQL, the same three cases (steps are 1-based): warmup linear to peak at
-- `warmup`; then linear from peak (or from anchor_lr at anchor_step, after a retime) to ratio*peak at
-- `horizon`; ratio*peak from the horizon on.
create or replace macro scheduled_lr(step, peak, warmup, horizon, ratio, anchor_step, anchor_lr) as
    case
        when step >= horizon then ratio * peak
        when anchor_step is not null and step >= anchor_step
            then anchor_lr + (ratio * peak - anchor_lr) * (step - anchor_step) / greatest(horizon - anchor_step, 1)
        when step < warmup then peak * greatest(step, 1) / warmup
        else peak + (ratio * peak - peak) * (step - warmup) / greatest(horizon - warmup, 1)
    end;

-- per (run, block): the latest attempt's block, with the tokens seen by its end and its mean loss
-- (the observed side of forecast vs actual)
create or replace view step_progress as
with latest as (
    select * from step_blocks
    qualify row_number() over (partition by run_id, block order by attempt desc) = 1
)
select
    run_id, block, step_lo, step_hi, l_n, l_sy / nullif(l_n, 0) as loss_mean,
    sum(tokens) over (partition by run_id order by block) as tokens_seen
from latest;

-- per (target run, fraction): the latest forecast point, at target_tokens (else fraction x the
-- target's token_budget); what forecast vs actual and the forecast_hit check compare with
create or replace view forecast_points as
select
    f.target_run as run_id, f.fraction, f.projected_loss, f.band_low, f.band_high, f.rungs, f.flags,
    f.ts as forecast_at, f.run_id as forecast_by_run,
    coalesce(f.target_tokens, f.fraction * p.token_budget) as at_tokens
from forecasts f
left join run_plan p on p.run_id = f.target_run
qualify row_number() over (partition by f.target_run, f.fraction order by f.ts desc, f.seq desc) = 1;
