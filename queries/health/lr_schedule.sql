-- Is the learning rate right at every step: recomputed from run_started.schedule and the applied set_token_horizon decisions?
--
-- The schedule is training/schedule.py's (the `scheduled_lr` macro in views.sql): warmup, then linear
-- decay to min_lr_ratio * peak at the horizon. A set_token_horizon decision applied from step s
-- (`after.from_step`, else `after.step`, else `after.anchor_step` as training/decisions.py writes the
-- retimed schedule, else the step after the decision_applied event's, which is emitted between
-- updates k-1 and k with step k-1) with a new horizon (`after.horizon_steps`, else
-- `after.horizon_tokens` / tokens_per_step) retimes the decay: from s the
-- lr goes linearly from lr(s) to min_lr_ratio * peak at the new horizon (before the end of warmup
-- only the horizon moves). A step of attempt a is held to the latest run_started of an attempt <= a
-- and to the decisions applied in attempts <= a; re-applying a retime already in a resumed
-- schedule changes nothing (the line through the same anchor), so a resumed run can carry it either way.
with recursive
tolerance as (
    select run_id, value from run_thresholds where name = 'lr_rel_tol'
), starts as (
    select
        run_id, attempt,
        (schedule ->> 'peak_lr')::double as peak,
        coalesce((schedule ->> 'warmup_steps')::bigint, 0) as warmup,
        coalesce((schedule ->> 'min_lr_ratio')::double, 0.05) as ratio,
        coalesce((schedule ->> 'tokens_per_step')::bigint, tokens_per_step) as tps,
        (schedule ->> 'horizon_steps')::bigint as horizon_steps,
        (schedule ->> 'horizon_tokens')::double as horizon_tokens,
        token_budget,
        (schedule ->> 'anchor_step')::bigint as anchor_step,
        (schedule ->> 'anchor_lr')::double as anchor_lr
    from runs
    qualify row_number() over (partition by run_id, attempt order by ts, seq) = 1
), bases as (
    select
        * exclude (horizon_steps, horizon_tokens, token_budget),
        coalesce(horizon_steps, ceil(horizon_tokens / tps)::bigint, ceil(token_budget / tps)::bigint) as horizon
    from starts
    where peak is not null
), attempts as (
    -- every attempt that logged steps, with the schedule it runs under
    select a.run_id, a.attempt, b.attempt as base_attempt
    from (select distinct run_id, attempt from step_blocks) a
    asof join bases b on a.run_id = b.run_id and a.attempt >= b.attempt
), applied as (
    select
        run_id, attempt as decided_in, ts, seq,
        coalesce((after ->> 'from_step')::bigint, (after ->> 'step')::bigint, (after ->> 'anchor_step')::bigint,
                 step + 1) as from_step,
        (after ->> 'horizon_steps')::bigint as horizon_steps,
        (after ->> 'horizon_tokens')::double as horizon_tokens
    from decisions_applied
    where action = 'set_token_horizon' and status = 'applied'
), retimes as (
    select
        a.run_id, a.attempt,
        row_number() over (partition by a.run_id, a.attempt order by d.from_step, d.ts, d.seq) as i,
        d.from_step,
        coalesce(d.horizon_steps, ceil(d.horizon_tokens / b.tps)::bigint) as horizon
    from attempts a
    join bases b on b.run_id = a.run_id and b.attempt = a.base_attempt
    join applied d on d.run_id = a.run_id and d.decided_in <= a.attempt
    where d.from_step is not null and coalesce(d.horizon_steps, d.horizon_tokens) is not null
), segments(run_id, attempt, i, from_step, horizon, anchor_step, anchor_lr) as (
    -- the schedule in force from each retime on, each built on the one before (as schedule.retime does)
    select a.run_id, a.attempt, 0::bigint, 0::bigint, b.horizon, b.anchor_step, b.anchor_lr
    from attempts a
    join bases b on b.run_id = a.run_id and b.attempt = a.base_attempt
    union all
    select
        s.run_id, s.attempt, r.i, r.from_step, r.horizon,
        case when r.from_step >= b.warmup then r.from_step else s.anchor_step end,
        case when r.from_step >= b.warmup
             then scheduled_lr(r.from_step, b.peak, b.warmup, s.horizon, b.ratio, s.anchor_step, s.anchor_lr)
             else s.anchor_lr end
    from segments s
    join retimes r on r.run_id = s.run_id and r.attempt = s.attempt and r.i = s.i + 1
    join attempts a on a.run_id = s.run_id and a.attempt = s.attempt
    join bases b on b.run_id = a.run_id and b.attempt = a.base_attempt
), ranges as (
    select
        g.*, b.peak, b.warmup, b.ratio, t.value * b.peak as tolerance,
        coalesce(lead(g.from_step) over (partition by g.run_id, g.attempt order by g.i), 9223372036854775807) as until_step
    from segments g
    join attempts a using (run_id, attempt)
    join bases b on b.run_id = a.run_id and b.attempt = a.base_attempt
    join tolerance t on t.run_id = g.run_id
), expected as (
    select
        s.run_id, s.step, s.lr, g.peak, g.tolerance,
        scheduled_lr(s.step, g.peak, g.warmup, g.horizon, g.ratio, g.anchor_step, g.anchor_lr) as expected
    from steps_all s
    join ranges g on g.run_id = s.run_id and g.attempt = s.attempt and s.step >= g.from_step and s.step < g.until_step
), checked as (
    select run_id, step, lr, expected, peak, abs(lr - expected) as err, abs(lr - expected) > tolerance as off
    from expected
), summary as (
    select
        run_id, count(*) as steps, max(err) / any_value(peak) as worst,
        count_if(off) as steps_off,
        min(case when off then step end) as first_step,
        arg_min(lr, case when off then step end) as first_lr,
        arg_min(expected, case when off then step end) as first_expected
    from checked
    group by run_id
), decided as (
    select run_id, count(*) as retimes from applied group by run_id
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
