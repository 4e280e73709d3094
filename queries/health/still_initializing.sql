-- Is an attempt still initializing: a run_started with no first step after init_max_s (Marin: 45 min)?
--
-- Each attempt's wait is from its run_started to its first step; the latest attempt with no step yet
-- and no run_finished waits until now (an earlier attempt with no step was superseded by the next).
with most as (
    select run_id, value from run_thresholds where name = 'init_max_s'
), starts as (
    select run_id, producer, attempt, min(ts) as started,
           row_number() over (partition by run_id order by attempt desc, min(ts) desc) = 1 as latest
    from runs
    group by run_id, producer, attempt
), firsts as (
    select run_id, producer, attempt, min(ts) as first_ts, min(step) as first_step
    from steps_all group by all
), finished as (
    select distinct run_id, producer, attempt from runs_finished
), waits as (
    select
        s.run_id, s.attempt, f.first_step,
        case when f.first_ts is not null then epoch(f.first_ts) - epoch(s.started)
             when s.latest and d.run_id is null then epoch(now()) - epoch(s.started) end as wait_s,
        f.first_ts is null as waiting
    from starts s
    left join firsts f using (run_id, producer, attempt)
    left join finished d using (run_id, producer, attempt)
), summary as (
    select w.run_id, count(*) as attempts, max(w.wait_s) as worst,
           count(*) filter (where w.wait_s > m.value) as attempts_over,
           arg_max(w.attempt, w.wait_s) as worst_attempt, bool_or(w.waiting and w.wait_s > m.value) as still
    from waits w
    join most m using (run_id)
    where w.wait_s is not null
    group by w.run_id
)
select
    r.run_id,
    'still_initializing' as "check",
    case when s.run_id is null then 'skip' when s.attempts_over > 0 then 'fail' else 'ok' end as status,
    s.worst as value,
    m.value as threshold,
    null::bigint as at_step,
    case when s.run_id is null then json_object('reason', 'no run_started')
         else json_object('attempts', s.attempts, 'attempts_over', s.attempts_over, 'worst_attempt', s.worst_attempt,
                          'still_waiting', s.still,
                          'measure', 'seconds from run_started to its attempt''s first step (to now while none)') end::varchar as evidence
from audit_runs r
join most m using (run_id)
left join summary s using (run_id)
