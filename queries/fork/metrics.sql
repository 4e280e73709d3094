-- How does every other number a fork and its parent both logged compare over the window: each one's mean in both runs and the largest step-by-step gap (reported, not judged)?
with win as (
    select distinct run_id, parent_run, step from fork_window
), logged as (  -- the free-form metrics (`runledger.log`) and the trainer's typed step fields, long form
    select run_id, step, time, key, value from metrics where value is not null
    union all
    select run_id, step, time, key, value from (
        unpivot (select run_id, step, time, grad_norm, lr, param_norm, router_entropy, tokens_per_s, step_time_s, z_loss, lb_loss
                 from steps where kind = 'step')
        on grad_norm, lr, param_norm, router_entropy, tokens_per_s, step_time_s, z_loss, lb_loss into name key value value)
), per_step as (  -- the last value of each name at each step of each run (by time; of two at one time, the larger)
    select run_id, step, key, arg_max(value, (time, value)) as value from logged group by all
), pairs as (
    select w.run_id, w.parent_run, w.step, a.key, a.value, b.value as parent_value
    from win w
    join per_step a on a.run_id = w.run_id and a.step = w.step
    join per_step b on b.run_id = w.parent_run and b.step = w.step and b.key = a.key
), by_key as (
    select run_id, any_value(parent_run) as parent_run, key, count(*) as n, min(step) as step_lo, max(step) as step_hi,
           avg(value order by step) as fork_mean, avg(parent_value order by step) as parent_mean,
           max(abs(value - parent_value)) as max_gap, arg_max(step, (abs(value - parent_value), -step)) as max_at
    from pairs group by run_id, key
)
select
    k.run_id,
    'fork_metric ' || k.key as "check",
    'ok' as status,
    k.fork_mean - k.parent_mean as value,
    null::double as threshold,
    k.max_at as at_step,
    json_object('parent', k.parent_run, 'window', 'steps ' || k.step_lo || '..' || k.step_hi, 'steps', k.n,
                'fork_mean', k.fork_mean, 'parent_mean', k.parent_mean, 'max_gap', k.max_gap,
                'measure', 'fork mean - parent mean over the window (reported, not judged)')::varchar as evidence
from by_key k
join audit_runs r using (run_id)
