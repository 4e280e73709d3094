-- Did the gradient norm spike: a step above grad_norm_median_ratio x the running median of the attempt's grad norms after warmup (default), or above grad_norm_max (Marin: 2.0), and from which step?
with th as (
    select
        run_id,
        max(value) filter (where name = 'grad_norm_max') as abs_max,
        max(value) filter (where name = 'grad_norm_median_ratio') as ratio,
        max(value) filter (where name = 'grad_norm_min_history') as min_history
    from run_thresholds
    group by run_id
), norms as (
    select s.run_id, s.attempt, s.step, s.grad_norm, s.step > coalesce(p.warmup_steps, 0) as after_warmup
    from steps_all s
    left join run_plan p using (run_id)
    where s.grad_norm is not null
), running as (
    -- the median of the attempt's grad norms after warmup, up to the step before
    select
        *,
        median(grad_norm) over w as running_median,
        count(*) over w as history
    from norms
    window w as (partition by run_id, attempt, after_warmup order by step rows between unbounded preceding and 1 preceding)
), judged as (
    select
        r.run_id, r.step, r.grad_norm,
        case when r.after_warmup and r.history >= t.min_history then r.grad_norm / nullif(r.running_median, 0) end as ratio_seen,
        t.abs_max >= 0 and r.grad_norm > t.abs_max as over_abs,
        t.ratio >= 0 and r.after_warmup and r.history >= t.min_history and r.grad_norm > t.ratio * r.running_median as over_rel
    from running r
    join th t using (run_id)
), summary as (
    select
        run_id, count(*) as n, max(grad_norm) as worst, max(ratio_seen) as worst_ratio,
        count(*) filter (where over_abs or over_rel) as steps_over,
        min(step) filter (where over_abs or over_rel) as first_step
    from judged
    group by run_id
)
select
    r.run_id,
    'grad_norm_max' as "check",
    case when coalesce(s.n, 0) = 0 then 'skip' when s.steps_over > 0 then 'fail' else 'ok' end as status,
    case when t.abs_max >= 0 then s.worst else s.worst_ratio end as value,
    case when t.abs_max >= 0 then t.abs_max else t.ratio end as threshold,
    s.first_step as at_step,
    case when coalesce(s.n, 0) = 0 then json_object('reason', 'no step reports a grad_norm')
         else json_object('steps_over', s.steps_over, 'steps_seen', s.n, 'max_grad_norm', s.worst,
                          'max_over_running_median', s.worst_ratio,
                          'rule', case when t.abs_max >= 0 and t.ratio >= 0 then 'grad_norm > grad_norm_max, or > grad_norm_median_ratio x the running median after warmup'
                                       when t.abs_max >= 0 then 'grad_norm > grad_norm_max (absolute)'
                                       else 'grad_norm > grad_norm_median_ratio x the running median after warmup' end) end::varchar as evidence
from audit_runs r
join th t using (run_id)
left join summary s using (run_id)
