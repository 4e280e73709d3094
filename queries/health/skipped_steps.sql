-- Were 3 or more steps skipped (non-finite loss) within any 15 minutes (Marin alert)?
with most as (
    select run_id, value from run_thresholds where name = 'skipped_steps_max'
), window_s as (
    select run_id, value from run_thresholds where name = 'skipped_window_s'
), skipped as (
    select run_id, step, ts from steps_all where skipped
), clusters as (
    -- for each skipped step: how many skipped steps in the window ending at it
    select a.run_id, a.step, count(*) as in_window
    from skipped a
    join window_s w on w.run_id = a.run_id
    join skipped b on b.run_id = a.run_id and b.ts <= a.ts and b.ts > a.ts - to_microseconds((w.value * 1e6)::bigint)
    group by a.run_id, a.step
), summary as (
    select
        c.run_id, max(c.in_window) as worst, count(*) as skipped,
        min(c.step) filter (c.in_window >= m.value) as first_step
    from clusters c
    join most m using (run_id)
    group by c.run_id
), observed as (
    select run_id, sum(n) as steps from step_blocks group by run_id
)
select
    r.run_id,
    'skipped_steps' as "check",
    case when o.steps is null then 'skip' when s.first_step is not null then 'fail' else 'ok' end as status,
    coalesce(s.worst, 0)::double as value,
    m.value as threshold,
    s.first_step as at_step,
    case when o.steps is null then json_object('reason', 'no steps')
         else json_object('skipped_steps', coalesce(s.skipped, 0), 'window_s', w.value,
                          'measure', 'most skipped steps within one window') end::varchar as evidence
from audit_runs r
join most m using (run_id)
join window_s w using (run_id)
left join observed o using (run_id)
left join summary s using (run_id)
