-- Is the run down: its latest attempt silent with its heartbeat stopped (views.sql runs.state 'crashed'; Marin's run_down)?
with latest as (
    select r.run_id, r.attempt, r.state, r.heartbeat_s, h.last_beat, r.heartbeat_s is not null or h.last_beat is not null as beats
    from runs r
    left join (select run_id, producer, attempt, max(ts) as last_beat from heartbeats group by all) h
        using (run_id, producer, attempt)
    qualify row_number() over (partition by r.run_id order by r.attempt desc, r.ts desc) = 1
), last_step as (
    select run_id, max(step) as step from steps_all group by run_id
)
select
    r.run_id,
    'run_down' as "check",
    case when l.run_id is null or not l.beats then 'skip' when l.state = 'crashed' then 'fail' else 'ok' end as status,
    epoch(now()) - epoch(l.last_beat) as value,
    null::double as threshold,
    case when l.state = 'crashed' then s.step end as at_step,
    case when l.run_id is null then json_object('reason', 'no run_started')
         when not l.beats then json_object('reason', 'the run sends no heartbeat')
         else json_object('state', l.state, 'attempt', l.attempt, 'last_heartbeat', l.last_beat,
                          'rule', 'crashed: no run_finished and the last heartbeat older than 2.5 intervals') end::varchar as evidence
from audit_runs r
left join latest l using (run_id)
left join last_step s using (run_id)
