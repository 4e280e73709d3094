-- Did the gradient norm ever exceed its alert threshold (Marin: grad norm > 2.0), and from which step?
with threshold as (
    select run_id, value from run_thresholds where name = 'grad_norm_max'
), observed as (
    select run_id, sum(g_n) as n, max(g_max) as worst from step_blocks group by run_id
), spikes as (
    select s.run_id, count(*) as n, min(s.step) as first_step
    from steps_all s
    join threshold t using (run_id)
    where s.grad_norm > t.value
    group by s.run_id
)
select
    r.run_id,
    'grad_norm_max' as "check",
    case when coalesce(o.n, 0) = 0 then 'skip' when x.n > 0 then 'fail' else 'ok' end as status,
    o.worst as value,
    t.value as threshold,
    x.first_step as at_step,
    case when coalesce(o.n, 0) = 0 then json_object('reason', 'no step reports a grad_norm')
         else json_object('steps_over', coalesce(x.n, 0), 'steps_seen', o.n) end::varchar as evidence
from audit_runs r
join threshold t using (run_id)
left join observed o using (run_id)
left join spikes x using (run_id)
