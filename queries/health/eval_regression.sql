-- Are the evals decreasing: is the newest eval worse than the one before by more than eval_noise_sigma x the evals' measured noise (default), worse at all (Marin), or worse than two evals ago or 2% worse than the last (marin-2024)?
with th as (
    select
        run_id,
        max(value) filter (where name = 'eval_noise_sigma') as k,
        max(value) filter (where name = 'eval_min_count') as min_count,
        max(value) filter (where name = 'eval_rise_last_max') as last_max,
        max(value) filter (where name = 'eval_rise_two_ago_max') as two_ago_max
    from run_thresholds
    group by run_id
), latest as (
    -- one eval per (run, split, step): the latest attempt's
    select run_id, coalesce(split, '') as split, step, loss from evals
    qualify row_number() over (partition by run_id, split, step order by attempt desc, ts desc, seq desc) = 1
), lagged as (
    select run_id, split, step, loss, lag(loss, 1) over w as prev1, lag(loss, 2) over w as prev2
    from latest
    window w as (partition by run_id, split order by step)
), noise as (
    -- the noise of an eval-to-eval change as measured on the evals before each one, from their second
    -- differences (a smooth trend's are ~0): an eval's noise s gives a change sd s sqrt(2) and a second
    -- difference sd s sqrt(6), so the change's is 1.4826 x the median absolute deviation of the second
    -- differences / sqrt(3)
    select
        run_id, split, step,
        1.4826 * mad(loss - 2 * prev1 + prev2) over before / sqrt(3) as sigma,
        count(prev2) over before as curves
    from lagged
    window before as (partition by run_id, split order by step rows between unbounded preceding and 1 preceding)
), flagged as (
    select
        l.*, n.sigma, (l.loss - l.prev1) / nullif(n.sigma, 0) as z,
        coalesce(t.k >= 0 and n.curves + 2 >= t.min_count and l.loss - l.prev1 > t.k * n.sigma, false) as worse_than_noise,
        coalesce(t.last_max >= 0 and l.loss > l.prev1 * (1 + t.last_max), false) as worse_than_last,
        coalesce(t.two_ago_max >= 0 and l.loss > l.prev2 * (1 + t.two_ago_max), false) as worse_than_two_ago
    from lagged l
    join th t using (run_id)
    left join noise n using (run_id, split, step)
), summary as (
    select
        run_id, count(*) as evals, max(loss / nullif(prev1, 0) - 1) as worst, max(z) filter (where sigma is not null) as worst_z,
        count(*) filter (where worse_than_noise or worse_than_last or worse_than_two_ago) as evals_over,
        min(step) filter (where worse_than_noise or worse_than_last or worse_than_two_ago) as first_step,
        count(*) filter (where worse_than_noise) as worse_than_noise,
        count(*) filter (where worse_than_two_ago) as worse_than_two_ago,
        count(*) filter (where worse_than_last) as worse_than_last,
        arg_max(sigma, step) as sigma
    from flagged
    group by run_id
)
select
    r.run_id,
    'eval_decreasing' as "check",
    case when coalesce(s.evals, 0) < 2 then 'skip' when s.evals_over > 0 then 'fail' else 'ok' end as status,
    case when t.k >= 0 then s.worst_z else s.worst end as value,
    case when t.k >= 0 then t.k else t.last_max end as threshold,
    s.first_step as at_step,
    case when coalesce(s.evals, 0) < 2 then json_object('reason', 'fewer than 2 evals')
         else json_object('evals', s.evals, 'noise_sigma', s.sigma, 'worse_than_noise', s.worse_than_noise,
                          'worse_than_two_ago', s.worse_than_two_ago,
                          'worse_than_last_by_more_than_threshold', s.worse_than_last,
                          'measure', case when t.k >= 0 then '(eval - previous eval) / the noise of an eval-to-eval change (from the second differences)'
                                          else 'eval / previous eval - 1' end) end::varchar as evidence
from audit_runs r
join th t using (run_id)
left join summary s using (run_id)
