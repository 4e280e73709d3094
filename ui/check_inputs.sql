-- Which inputs of the health checks each run logged ($runs: the run ids): the checklist lists, and the
-- runs page counts, only the checks whose inputs the run has (runledger.ui.health.CHECK_INPUTS). Read
-- over the views the checks read, by their rules (a `runledger.log` run's metrics count under the names
-- steps_all and evals read them by, as steps where it logged a loss), so a check listed is one that looked
-- at data.
with asked as (
    select unnest($runs::varchar[]) as run_id
), typed as (  -- runledger's trainer's typed steps (one pass over a few columns; no window as steps_all has)
    select run_id, true as steps, count(loss) > 0 as loss, count(grad_norm) > 0 as grad_norm, count(lr) > 0 as lr,
           count(param_norm) > 0 as param_norm, count(router_entropy) > 0 as router_entropy,
           count(mfu) + count(tokens_per_s) > 0 as throughput,
           count(router_bias_min) + count(router_bias_max) > 0 as router_bias
    from step_events where list_contains($runs, run_id) group by run_id
), logged as (  -- a `runledger.log` run's steps: its metrics under the names steps_all reads, where it logged a loss
    select run_id,
           count(coalesce("metrics/loss", "metrics/train/loss")) + count(coalesce(nonfinite['loss'], nonfinite['train/loss'])) > 0 as steps,
           count(coalesce("metrics/loss", "metrics/train/loss")) > 0 as loss,
           count(coalesce("metrics/grad_norm", "metrics/train/grad_norm", "metrics/optim/grad_norm")) > 0 as grad_norm,
           count(coalesce("metrics/lr", "metrics/learning_rate", "metrics/train/lr", "metrics/optim/learning_rate")) > 0 as lr,
           count(coalesce("metrics/param_norm", "metrics/train/param_norm", "metrics/optim/param_norm")) > 0 as param_norm,
           count(coalesce("metrics/router_entropy", "metrics/train/router_entropy")) > 0 as router_entropy,
           count(coalesce("metrics/mfu", "metrics/train/mfu", "metrics/throughput/mfu", "metrics/tokens_per_s",
                          "metrics/throughput/tokens_per_second")) > 0 as throughput,
           count(coalesce("metrics/router_bias_min", "metrics/router_bias_max")) > 0 as router_bias
    from metrics_checked
    where list_contains($runs, run_id) and run_id not in (select run_id from step_events)
    group by run_id
), s as (
    select * from typed
    union all
    select run_id, steps, loss, steps and grad_norm, steps and lr, steps and param_norm, steps and router_entropy,
           steps and throughput, steps and router_bias
    from logged where steps
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
       coalesce(s.throughput, false) as throughput, coalesce(s.router_bias, false) as router_bias,
       coalesce(e.evals, false) as evals,
       coalesce(d.drops, false) as drops, coalesce(f.forecast, false) as forecast,
       coalesce(r.run_started, false) as run_started, coalesce(r.schedule, false) as schedule,
       coalesce(r.plan, false) as plan, coalesce(t.telemetry, false) or s.run_id is not null as telemetry
from asked a
left join s using (run_id) left join e using (run_id) left join d using (run_id) left join f using (run_id)
left join r using (run_id) left join t using (run_id)
