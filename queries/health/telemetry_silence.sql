-- Did the run's telemetry go silent for longer than the threshold (Marin: > 10 min), between events or since the last one?
--
-- Exact without a window over every event: events are bucketed by half the (smallest) threshold
-- (silence_bucket in views.sql); a gap longer than the threshold always spans an empty bucket, so it
-- is a gap between consecutive non-empty buckets, and a gap inside one bucket is shorter than the
-- threshold. The steps come bucketed already, from the one pass over them (step_cells).
with threshold as (
    select run_id, value from run_thresholds where name = 'silence_max_s'
), telemetry as (
    -- what the run's own workers emit (not the agents' decisions, alerts or forecasts), besides the steps
    select run_id, ts, step from runs
    union all select run_id, ts, step from drops
    union all select run_id, ts, step from evals
    union all select run_id, ts, step from checkpoints
    union all select run_id, ts, step from data
    union all select run_id, ts, step from decisions_applied
    union all select run_id, ts, step from runs_finished
), bucketed as (
    select
        run_id, epoch_us(ts) // (select us from silence_bucket) as bucket,
        ts as first_ts, ts as last_ts, step as last_step
    from telemetry
    union all
    select run_id, bucket, ts_lo, ts_hi, step_hi from step_cells
), buckets as (
    select run_id, bucket, min(first_ts) as first_ts, max(last_ts) as last_ts, max(last_step) as last_step
    from bucketed
    group by run_id, bucket
), gaps as (
    select
        run_id, last_step as step_before,
        epoch(lead(first_ts) over w) - epoch(last_ts) as gap_s
    from buckets
    window w as (partition by run_id order by bucket)
), finished as (
    select distinct run_id from runs_finished
), tail as (
    -- a run with no run_finished is silent since its last event
    select b.run_id, arg_max(b.last_step, b.last_ts) as step_before, epoch(now()) - epoch(max(b.last_ts)) as gap_s
    from buckets b
    anti join finished f using (run_id)
    group by b.run_id
), all_gaps as (
    select run_id, step_before, gap_s, 'between events' as kind from gaps where gap_s is not null
    union all
    select run_id, step_before, gap_s, 'since the last event (no run_finished)' from tail
), summary as (
    select
        g.run_id, max(g.gap_s) as worst, count(*) filter (g.gap_s > t.value) as gaps_over,
        min(g.step_before) filter (g.gap_s > t.value) as first_step,
        arg_max(g.kind, g.gap_s) as worst_kind
    from all_gaps g
    join threshold t using (run_id)
    group by g.run_id
), seen as (
    select distinct run_id from buckets
)
select
    r.run_id,
    'telemetry_silence' as "check",
    case when n.run_id is null then 'skip' when coalesce(s.gaps_over, 0) > 0 then 'fail' else 'ok' end as status,
    coalesce(s.worst, 0) as value,
    t.value as threshold,
    s.first_step as at_step,
    case when n.run_id is null then json_object('reason', 'no telemetry events from the run''s workers')
         else json_object('gaps_over', coalesce(s.gaps_over, 0), 'longest_gap', s.worst_kind,
                          'measure', 'seconds between consecutive worker events') end::varchar as evidence
from audit_runs r
join threshold t using (run_id)
left join seen n using (run_id)
left join summary s using (run_id)
