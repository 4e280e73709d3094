-- Does the fork's loss match its parent's: over the window, is the mean of (fork loss - parent loss), step by step, above fork_loss_delta_max?
with threshold as (
    select run_id, value from run_thresholds where name = 'fork_loss_delta_max'
), deltas as (
    select
        run_id, any_value(parent_run) as parent_run, any_value(fork_step) as fork_step,
        count(*) as n, min(step) as step_lo, max(step) as step_hi,
        avg(loss - parent_loss order by step) as mean_delta,
        max(loss - parent_loss) as max_delta,
        arg_max(step, (loss - parent_loss, -step)) as max_at
    from fork_window
    where loss is not null and parent_loss is not null
    group by run_id
)
select
    r.run_id,
    'fork_loss' as "check",
    case when d.n is null then 'skip' when d.mean_delta > t.value then 'fail' else 'ok' end as status,
    d.mean_delta as value,
    t.value as threshold,
    d.max_at as at_step,
    case when d.n is null then json_object('reason', 'not a fork, or no step after its fork point with a loss in it and its parent')
         else json_object('parent', d.parent_run, 'fork_step', d.fork_step, 'window', 'steps ' || d.step_lo || '..' || d.step_hi,
                          'steps', d.n, 'mean_delta', d.mean_delta, 'max_delta', d.max_delta, 'max_at', d.max_at,
                          'measure', 'fork loss - parent loss at the same step (nats), mean over the window') end::varchar as evidence
from audit_runs r
join threshold t using (run_id)
left join deltas d using (run_id)
