-- Is the learning rate right at every step: recomputed from run_started.schedule and the applied set_token_horizon decisions?
--
-- The schedule is training/schedule.py's (the `scheduled_lr` macro in views.sql): warmup, then linear
-- decay to min_lr_ratio * peak at the horizon, retimed from the step each applied set_token_horizon
-- decision names. `lr_segments` in views.sql recomputes which schedule holds for each attempt and
-- step; the one pass over the steps (step_cells, summed in step_blocks) compares every step's lr with
-- it: how many steps were held to a schedule, the largest |lr - expected|, how many were off by more
-- than lr_rel_tol x peak, and the first of those with its lr and expected lr.
with tolerance as (
    select run_id, value from run_thresholds where name = 'lr_rel_tol'
), summary as (
    select
        run_id, sum(lr_n)::bigint as steps, max(lr_err) / any_value(lr_peak) as worst,
        sum(lr_off)::bigint as steps_off,
        min(lr_off_step) as first_step,
        arg_min(lr_off_lr, lr_off_step) as first_lr,
        arg_min(lr_off_expected, lr_off_step) as first_expected
    from step_blocks
    where lr_n > 0
    group by run_id
), decided as (
    select run_id, count(*) as retimes
    from decisions_applied
    where action = 'set_token_horizon' and status = 'applied'
    group by run_id
)
select
    r.run_id,
    'lr_schedule' as "check",
    case when s.steps is null then 'skip' when s.steps_off > 0 then 'fail' else 'ok' end as status,
    s.worst as value,
    t.value as threshold,
    s.first_step as at_step,
    case when s.steps is null then json_object('reason', 'no run_started with a schedule (peak_lr), or no steps')
         else json_object('steps_checked', s.steps, 'steps_off', s.steps_off, 'retimes_applied', coalesce(d.retimes, 0),
                          'first_off_lr', s.first_lr, 'first_off_expected', s.first_expected,
                          'measure', '|lr - expected| / peak_lr') end::varchar as evidence
from audit_runs r
join tolerance t using (run_id)
left join summary s using (run_id)
left join decided d using (run_id)
