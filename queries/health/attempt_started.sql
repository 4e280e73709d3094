-- Did the run restart: is there an attempt > 0 (informational, as Marin's task_retried)?
with attempts as (
    select run_id, max(attempt) as last_attempt, count(distinct attempt) as attempts,
           arg_max(step, attempt) as resumed_at
    from runs
    group by run_id
)
select
    r.run_id,
    'attempt_started' as "check",
    case when a.run_id is null then 'skip' when a.last_attempt > 0 then 'warn' else 'ok' end as status,
    a.last_attempt::double as value,
    0.0 as threshold,
    case when a.last_attempt > 0 then a.resumed_at end as at_step,
    case when a.run_id is null then json_object('reason', 'no run_started')
         else json_object('attempts', a.attempts, 'latest_attempt', a.last_attempt,
                          'measure', 'the latest attempt (0: never restarted); informational') end::varchar as evidence
from audit_runs r
left join attempts a using (run_id)
