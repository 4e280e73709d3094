-- Is the gradient norm rising across a trailing window after warmup (views.sql grad_norm_rise: the rule the agent reads too), by more than grad_norm_rise_max of its mean and, by default, standing out of its noise (the slope's t statistic above grad_norm_rise_t)?
with threshold as (
    select run_id, value from run_thresholds where name = 'grad_norm_rise_max'
), t_min as (
    select run_id, value from run_thresholds where name = 'grad_norm_rise_t'
), width as (
    select run_id, value::bigint as k from run_thresholds where name = 'window_blocks'
), trailing_window as (
    -- regr_slope(grad_norm, step) over the trailing k blocks, from the blocks' sums (taken in block
    -- order, list_sum of the frame: a window sum's rounding depends on how DuckDB lays out the
    -- partitions, so it would differ with the other runs audited beside this one)
    select
        b.run_id, b.attempt, b.block, b.step_hi, w.k,
        count(*) over win as blocks,
        sum(b.g_n) over win as n, list_sum(list(b.g_sx) over win) as sx, list_sum(list(b.g_sy) over win) as sy,
        list_sum(list(b.g_sxx) over win) as sxx, list_sum(list(b.g_sxy) over win) as sxy,
        list_sum(list(b.g_syy) over win) as syy,
        min(b.step_lo) over win as lo, max(b.step_hi) over win as hi
    from step_blocks b
    join width w using (run_id)
    left join run_plan p using (run_id)
    where b.g_n > 0 and b.step_lo > coalesce(p.warmup_steps, 0)  -- the grad norm falls and rises through warmup
    window win as (partition by b.run_id, b.attempt order by b.block rows between w.k - 1 preceding and current row)
), rise as (
    select
        run_id, attempt, step_hi,
        grad_norm_rise((n * sxy - sx * sy) / nullif(n * sxx - sx * sx, 0), lo, hi, sy / n) as rel_change,
        -- the slope's t statistic, r sqrt((n - 2) / (1 - r^2)): how far the rise stands out of the grad norm's noise
        case when r2 >= 1 then 1e9 else sqrt(greatest(r2, 0) * (n - 2) / (1 - r2)) end as t
    from (select *, (n * sxy - sx * sy) ^ 2 / nullif((n * sxx - sx * sx) * (n * syy - sy * sy), 0) as r2 from trailing_window)
    where blocks = k and n > 2
), worst as (
    select
        x.run_id, count(*) as windows, max(x.rel_change) as worst,
        min(x.step_hi) filter (x.rel_change > t.value and (m.value < 0 or x.t > m.value)) as first_step,
        count(*) filter (x.rel_change > t.value and (m.value < 0 or x.t > m.value)) as windows_over
    from rise x
    join threshold t using (run_id)
    join t_min m using (run_id)
    group by x.run_id
)
select
    r.run_id,
    'grad_norm_rise' as "check",
    case when w.windows is null then 'skip' when w.windows_over > 0 then 'warn' else 'ok' end as status,
    w.worst as value,
    t.value as threshold,
    w.first_step as at_step,
    case when w.windows is null then json_object('reason', 'fewer than window_blocks blocks of steps with a grad_norm')
         else json_object('windows', w.windows, 'windows_over', w.windows_over,
                          'measure', 'regr_slope(grad_norm, step) * window steps / mean grad_norm; over when above the threshold with the slope''s t above grad_norm_rise_t') end::varchar as evidence
from audit_runs r
join threshold t using (run_id)
left join worst w using (run_id)
