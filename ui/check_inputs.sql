-- Which inputs of the health checks each run logged ($runs: the run ids): the checklist lists, and the
-- runs page counts, only the checks whose inputs the run has (runledger.ui.health.CHECK_INPUTS). Read
-- over the views the checks read (a `runledger.log` run's metrics count under the names steps_all and
-- evals read them by), so a check listed is one that looked at data.
with asked as (
    select unnest($runs::varchar[]) as run_id
), s as (
    select run_id, true as steps, count(loss) > 0 as loss, count(grad_norm) > 0 as grad_norm, count(lr) > 0 as lr,
           count(param_norm) > 0 as param_norm, count(router_entropy) > 0 as router_entropy,
           count(mfu) + count(tokens_per_s) > 0 as throughput
    from steps_all where list_contains($runs, run_id) group by run_id
), e as (
    select run_id, true as evals from evals where list_contains($runs, run_id) group by run_id
), d as (
    select run_id, true as drops from drops where list_contains($runs, run_id) group by run_id
), f as (
    select target_run as run_id, true as forecast from forecasts where list_contains($runs, target_run) group by all
), r as (
    select run_id, true as run_started,
           bool_or(schedule ->> 'peak_lr' is not null) as schedule,
           bool_or(planned_tokens_per_s > 0 or (config ->> 'planned_mfu')::double > 0) as plan
    from runs where list_contains($runs, run_id) group by run_id
), t as (  -- what telemetry_silence reads besides the steps
    select run_id, true as telemetry from (
        select run_id from runs union all select run_id from drops union all select run_id from evals
        union all select run_id from checkpoints union all select run_id from data
        union all select run_id from decisions_applied union all select run_id from runs_finished)
    where list_contains($runs, run_id) group by run_id
)
select a.run_id, coalesce(s.steps, false) as steps,
       coalesce(s.loss, false) as loss, coalesce(s.grad_norm, false) as grad_norm, coalesce(s.lr, false) as lr,
       coalesce(s.param_norm, false) as param_norm, coalesce(s.router_entropy, false) as router_entropy,
       coalesce(s.throughput, false) as throughput, coalesce(e.evals, false) as evals,
       coalesce(d.drops, false) as drops, coalesce(f.forecast, false) as forecast,
       coalesce(r.run_started, false) as run_started, coalesce(r.schedule, false) as schedule,
       coalesce(r.plan, false) as plan, coalesce(t.telemetry, false) or s.run_id is not null as telemetry
from asked a
left join s using (run_id) left join e using (run_id) left join d using (run_id) left join f using (run_id)
left join r using (run_id) left join t using (run_id)
