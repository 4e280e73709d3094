-- How far is the run's training compute from the thresholds that matter: its cumulative FLOPs (tokens x FLOPs per token) against 10^23 and 10^25 FLOP (the EU AI Act's general-purpose and systemic-risk presumptions), and the step at which the plan says it crosses each?
with th as (
    select
        run_id,
        max(value) filter (where name = 'compute_gpai_flop') as gpai,
        max(value) filter (where name = 'compute_systemic_flop') as systemic
    from run_thresholds
    group by run_id
), per_token as (
    select run_id, arg_max(flops_per_token, ts) as flops_per_token from runs group by run_id
), spent as (
    select
        s.run_id, max(s.step) as last_step, count(*) as steps,
        sum(s.tokens * coalesce(s.flops_per_token, p.flops_per_token)) as flops,
        count(*) filter (where coalesce(s.flops_per_token, p.flops_per_token) is null) as unknown
    from steps s
    left join per_token p using (run_id)
    group by s.run_id
), forecast as (
    select
        s.*, s.flops / nullif(s.last_step, 0) as per_step, p.horizon_steps, t.gpai, t.systemic,
        s.flops / nullif(s.last_step, 0) * p.horizon_steps as planned_flops
    from spent s
    join th t using (run_id)
    left join run_plan p using (run_id)
)
select
    r.run_id,
    'compute_thresholds' as "check",
    case when f.flops is null or f.unknown > 0 then 'skip' when f.flops >= f.gpai then 'warn' else 'ok' end as status,
    f.flops as value,
    case when f.flops >= f.gpai then f.systemic else f.gpai end as threshold,
    case when f.flops >= f.gpai then ceil(f.gpai / f.per_step)::bigint end as at_step,
    case when f.run_id is null then json_object('reason', 'no steps')
         when f.flops is null or f.unknown > 0 then json_object('reason', 'no FLOPs per token (step.flops_per_token or run_started.flops_per_token)')
         else json_object('flops', f.flops, 'planned_flops', f.planned_flops,
                          'crosses_1e23_at_step', ceil(f.gpai / f.per_step)::bigint,
                          'crosses_1e25_at_step', ceil(f.systemic / f.per_step)::bigint,
                          'within_plan_1e23', f.planned_flops >= f.gpai, 'within_plan_1e25', f.planned_flops >= f.systemic,
                          'measure', 'cumulative tokens x FLOPs per token; the crossing steps at the mean FLOPs per step so far') end::varchar as evidence
from audit_runs r
join th t using (run_id)
left join forecast f using (run_id)
