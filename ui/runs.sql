-- The runs page: one row per run with what the list shows and filters on (status, last step, last
-- event, tags, name, group, job type, config, open alerts). One pass over each kind it reads (run_started,
-- config_updates, the typed steps and the free-form metrics for the last step, run_finished, alerts), grouped
-- by run. `config`: the run's config with every config.update applied (the `runs` view's config_final);
-- name, group and job_type: the earliest start's, else an imported run's own (run_started.config._import). The dashboard
-- puts the same rows together from each file's parts (runledger.ui.runs.FILE_PARTS, kept by file, so a
-- restart or a new file costs only the new files); this query is what they must equal (tests/{unit,integration,e2e}/test_ui.py)
-- and what `runledger sql` can run. `silent` (no event for silence_max_s) is judged when asked.
with started as (
    select
        run_id,
        arg_min(project, ts) as project,
        arg_min(tags, ts) as tags,
        arg_min(name, ts) filter (name is not null and name <> '') as name,
        arg_min("group", ts) filter ("group" is not null and "group" <> '') as "group",
        arg_min(job_type, ts) filter (job_type is not null and job_type <> '') as job_type,
        arg_min(config -> '_import', ts) as source,
        arg_min(preset, ts) as preset,
        arg_min(ladder ->> 'name', ts) as ladder,
        min(ts) as started_at,
        max(ts) as last_start,
        count(distinct attempt) as attempts
    from runs
    group by run_id
), configs as (
    select run_id, to_json(list_reduce(list(config order by ts, late, attempt, seq) filter (config is not null),
                                       lambda a, b: map_concat(a, b), map()::map(varchar, json))) as config
    from (select run_id, ts, false as late, attempt, seq,
                 case when json_type(config) = 'OBJECT' then config::json::map(varchar, json) end as config
          from runs
          union all
          select run_id, ts, true, attempt, seq,
                 case when json_type(config) = 'OBJECT' then config::json::map(varchar, json) end
          from config_updates)
    group by run_id
), stepped as (
    select run_id, max(step) as last_step, max(ts) as last_ts, count(*) as steps
    from (select run_id, step, ts from step_events union all select run_id, step, ts from metric_events)
    group by run_id
), finished as (
    select run_id, arg_max(status, ts) as status, max(ts) as finished_at
    from runs_finished
    group by run_id
), alerted as (
    select run_id,
           count(*) filter (severity = 'warn') as alerts_warn,
           count(*) filter (severity = 'fail') as alerts_fail
    from open_alerts
    group by run_id
)
select
    s.run_id, s.project, s.preset, s.ladder, s.attempts,
    coalesce(s.name, s.source ->> 'name', s.source ->> 'run_name') as name,
    coalesce(s."group", s.source ->> 'group') as "group", coalesce(s.job_type, s.source ->> 'job_type') as job_type,
    coalesce(from_json(s.tags, '["VARCHAR"]'), []) as tags,
    c.config, f.status as finished, p.last_step, coalesce(p.steps, 0) as steps, s.started_at,
    greatest(coalesce(p.last_ts, s.last_start), s.last_start, coalesce(f.finished_at, s.last_start)) as last_event,
    coalesce(a.alerts_warn, 0) as alerts_warn, coalesce(a.alerts_fail, 0) as alerts_fail
from started s
left join configs c using (run_id)
left join stepped p using (run_id)
left join finished f using (run_id)
left join alerted a using (run_id)
