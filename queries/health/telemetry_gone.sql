-- Did the run's telemetry go while its heartbeat goes on (the process lives, its steps stopped): silent for silence_gap_factor x its median step gap, at least stall_min_s (default), or silence_max_s (Marin: 10 min)?
with th as (
    select
        run_id,
        max(value) filter (where name = 'silence_gap_factor') as factor,
        max(value) filter (where name = 'stall_min_s') as min_s,
        max(value) filter (where name = 'silence_max_s') as max_s
    from run_thresholds
    group by run_id
), latest as (
    -- the latest attempt of each run, its state (views.sql runs: from its heartbeat) and whether it beats
    select r.run_id, r.producer, r.attempt, r.state, r.heartbeat_s is not null or h.n > 0 as beats
    from runs r
    left join (select run_id, producer, attempt, count(*) as n from heartbeats group by all) h
        using (run_id, producer, attempt)
    qualify row_number() over (partition by r.run_id order by r.attempt desc, r.ts desc) = 1
), gaps as (
    select run_id, median(gap) as median_gap, max(ts) as last_step_ts
    from (select run_id, ts, epoch(ts) - epoch(lag(ts) over (partition by run_id, producer, attempt order by step)) as gap
          from steps_all)
    group by run_id
), telemetry as (
    select run_id, max(ts) as last_ts
    from (select run_id, ts from steps_all union all select run_id, ts from evals
          union all select run_id, ts from checkpoints union all select run_id, ts from drops
          union all select run_id, ts from runs)
    group by run_id
), judged as (
    select
        l.run_id, l.state, l.beats, epoch(now()) - epoch(x.last_ts) as silent_s,
        case when t.factor >= 0 then greatest(t.factor * coalesce(g.median_gap, 0), t.min_s) else t.max_s end as limit_s
    from latest l
    join th t using (run_id)
    left join gaps g using (run_id)
    left join telemetry x using (run_id)
)
select
    r.run_id,
    'telemetry_gone' as "check",
    case when j.run_id is null or not j.beats or j.state <> 'running' then 'skip'
         when j.silent_s > j.limit_s then 'fail' else 'ok' end as status,
    case when j.beats and j.state = 'running' then j.silent_s end as value,
    j.limit_s as threshold,
    null::bigint as at_step,
    case when j.run_id is null then json_object('reason', 'no run_started')
         when not j.beats then json_object('reason', 'the run sends no heartbeat: telemetry_silence judges its silence')
         when j.state <> 'running' then json_object('reason', 'the run is ' || j.state || ', not running', 'state', j.state)
         else json_object('state', j.state, 'silent_s', j.silent_s,
                          'measure', 'seconds since the last worker event of a run whose heartbeat goes on') end::varchar as evidence
from audit_runs r
join th t using (run_id)
left join judged j using (run_id)
