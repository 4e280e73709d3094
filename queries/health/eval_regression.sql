-- Are the evals decreasing: is any eval worse than two evals ago, or more than 2% worse than the last (Marin alerts)?
with two_ago as (
    select run_id, value from run_thresholds where name = 'eval_rise_two_ago_max'
), last_one as (
    select run_id, value from run_thresholds where name = 'eval_rise_last_max'
), latest as (
    -- one eval per (run, split, step): the latest attempt's
    select run_id, split, step, loss from evals
    qualify row_number() over (partition by run_id, split, step order by attempt desc, ts desc, seq desc) = 1
), lagged as (
    select
        run_id, split, step, loss,
        lag(loss, 1) over w as prev1,
        lag(loss, 2) over w as prev2
    from latest
    window w as (partition by run_id, split order by step)
), flagged as (
    select
        l.*,
        l.loss / nullif(l.prev1, 0) - 1 as rise_last,
        coalesce(l.loss > l.prev2 * (1 + a.value), false) as worse_than_two_ago,
        coalesce(l.loss > l.prev1 * (1 + b.value), false) as worse_than_last
    from lagged l
    join two_ago a using (run_id)
    join last_one b using (run_id)
), summary as (
    select
        run_id, count(*) as evals, max(rise_last) as worst,
        count(*) filter (worse_than_two_ago or worse_than_last) as evals_over,
        min(step) filter (worse_than_two_ago or worse_than_last) as first_step,
        count(*) filter (worse_than_two_ago) as worse_than_two_ago,
        count(*) filter (worse_than_last) as worse_than_last
    from flagged
    group by run_id
)
select
    r.run_id,
    'eval_decreasing' as "check",
    case when coalesce(s.evals, 0) < 2 then 'skip' when s.evals_over > 0 then 'fail' else 'ok' end as status,
    s.worst as value,
    b.value as threshold,
    s.first_step as at_step,
    case when coalesce(s.evals, 0) < 2 then json_object('reason', 'fewer than 2 evals')
         else json_object('evals', s.evals, 'worse_than_two_ago', s.worse_than_two_ago,
                          'worse_than_last_by_more_than_threshold', s.worse_than_last) end::varchar as evidence
from audit_runs r
join last_one b using (run_id)
left join summary s using (run_id)
