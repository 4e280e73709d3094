-- Is the router's load-balancing bias running away: a step's max |bias| above router_bias_median_ratio x the running median (default), or above router_bias_max (Marin: 400)?
with th as (
    select
        run_id,
        max(value) filter (where name = 'router_bias_max') as abs_max,
        max(value) filter (where name = 'router_bias_median_ratio') as ratio
    from run_thresholds
    group by run_id
), biases as (
    select run_id, attempt, step, greatest(abs(router_bias_min), abs(router_bias_max)) as bias
    from steps_all
    where router_bias_min is not null or router_bias_max is not null
), running as (
    select *, median(bias) over w as running_median, count(*) over w as history
    from biases
    window w as (partition by run_id, attempt order by step rows between unbounded preceding and 1 preceding)
), judged as (
    select
        r.run_id, r.step, r.bias, r.bias / nullif(r.running_median, 0) as ratio_seen,
        (t.abs_max >= 0 and r.bias > t.abs_max)
            or (t.ratio >= 0 and r.history >= 10 and r.bias > t.ratio * r.running_median) as over
    from running r
    join th t using (run_id)
), summary as (
    select run_id, count(*) as n, max(bias) as worst, max(ratio_seen) as worst_ratio,
           count(*) filter (where over) as steps_over, min(step) filter (where over) as first_step
    from judged
    group by run_id
)
select
    r.run_id,
    'router_bias' as "check",
    case when s.n is null then 'skip' when s.steps_over > 0 then 'fail' else 'ok' end as status,
    case when t.abs_max >= 0 then s.worst else s.worst_ratio end as value,
    case when t.abs_max >= 0 then t.abs_max else t.ratio end as threshold,
    s.first_step as at_step,
    case when s.n is null then json_object('reason', 'no step reports router_bias_min / router_bias_max')
         else json_object('steps', s.n, 'steps_over', s.steps_over, 'max_abs_bias', s.worst,
                          'max_over_running_median', s.worst_ratio) end::varchar as evidence
from audit_runs r
join th t using (run_id)
left join summary s using (run_id)
