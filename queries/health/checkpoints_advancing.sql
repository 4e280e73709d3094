-- Are checkpoints advancing: is there a complete checkpoint within checkpoint_gap_factor x the planned interval (config.ckpt_every, else the run's median gap) of every step?
with factor as (
    select run_id, value from run_thresholds where name = 'checkpoint_gap_factor'
), saved as (
    select run_id, step from checkpoints where step is not null group by all
), reached as (
    select run_id, min(step) as first_step, max(step) as last_step from steps group by run_id
), gaps as (
    -- from the run's start (step 0) to its first checkpoint, between checkpoints, and from the last to the last step
    select run_id, step - coalesce(lag(step) over (partition by run_id order by step), 0) as gap, step as at_step
    from saved
    union all
    select x.run_id, x.last_step - coalesce(max(s.step), 0), coalesce(max(s.step), 0)
    from reached x left join saved s using (run_id)
    group by x.run_id, x.last_step
), plan as (
    select
        r.run_id,
        coalesce(p.ckpt_every::double, (select median(g.gap) from gaps g join saved s on s.run_id = g.run_id and s.step = g.at_step
                                         where g.run_id = r.run_id)) as interval_steps
    from audit_runs r
    left join run_plan p using (run_id)
), summary as (
    select
        g.run_id, count(*) as gaps, max(g.gap) as worst, any_value(p.interval_steps) as interval_steps,
        count(*) filter (where g.gap > f.value * p.interval_steps) as gaps_over,
        min(g.at_step) filter (where g.gap > f.value * p.interval_steps) as first_step
    from gaps g
    join plan p using (run_id)
    join factor f using (run_id)
    where p.interval_steps > 0
    group by g.run_id
)
select
    r.run_id,
    'checkpoints_advancing' as "check",
    case when s.run_id is null then 'skip' when s.gaps_over > 0 then 'fail' else 'ok' end as status,
    s.worst / nullif(s.interval_steps, 0) as value,
    f.value as threshold,
    s.first_step as at_step,
    case when s.run_id is null then json_object('reason', 'no planned checkpoint interval (config.ckpt_every) and no checkpoints')
         else json_object('interval_steps', s.interval_steps, 'gaps', s.gaps, 'gaps_over', s.gaps_over,
                          'measure', 'the longest stretch of steps without a checkpoint / the planned interval') end::varchar as evidence
from audit_runs r
join factor f using (run_id)
left join summary s using (run_id)
