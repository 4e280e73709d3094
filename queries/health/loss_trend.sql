-- Is the loss still decreasing: is a trailing window's mean loss above the previous window's by more than loss_rise_sigma standard errors of that difference, from the run's loss noise (default), or by more than loss_rise_max (Marin profile: 0.05)?
with th as (
    select
        run_id,
        max(value) filter (where name = 'loss_rise_max') as abs_max,
        max(value) filter (where name = 'loss_rise_sigma') as k
    from run_thresholds
    group by run_id
), threshold as (
    select t.run_id, t.abs_max, t.k, n.sigma, case when t.abs_max >= 0 then t.abs_max else t.k end as value
    from th t left join loss_noise n using (run_id)
), width as (
    select run_id, value::bigint as k from run_thresholds where name = 'window_blocks'
), windows as (
    -- for each block: the mean loss of the k blocks ending there and of the k blocks before those (the
    -- sums taken in block order, list_sum of the frame: a window sum's rounding depends on how DuckDB
    -- lays out the partitions, so it would differ with the other runs audited beside this one)
    select
        b.run_id, b.attempt, b.block, b.step_hi, w.k,
        list_sum(list(b.l_sy) over cur) / sum(b.l_n) over cur as cur_mean, sum(b.l_n) over cur as cur_n, sum(b.l_n) over prev as prev_n,
        count(*) over cur as cur_blocks,
        list_sum(list(b.l_sy) over prev) / sum(b.l_n) over prev as prev_mean,
        count(*) over prev as prev_blocks
    from step_blocks b
    join width w using (run_id)
    where b.l_n > 0
    window
        cur as (partition by b.run_id, b.attempt order by b.block rows between w.k - 1 preceding and current row),
        prev as (partition by b.run_id, b.attempt order by b.block rows between 2 * w.k - 1 preceding and w.k preceding)
), rises as (
    select
        x.run_id, count(*) as windows,
        max(case when t.abs_max >= 0 then x.cur_mean - x.prev_mean else x.z end) as worst,
        count(*) filter (t.abs_max >= 0 and x.cur_mean - x.prev_mean > t.abs_max or t.k >= 0 and x.z > t.k) as windows_over,
        min(x.step_hi) filter (t.abs_max >= 0 and x.cur_mean - x.prev_mean > t.abs_max or t.k >= 0 and x.z > t.k) as first_step
    from (select w.*, (w.cur_mean - w.prev_mean) / nullif(n.sigma * sqrt(1.0 / w.cur_n + 1.0 / w.prev_n), 0) as z
          from windows w left join loss_noise n using (run_id)) x
    join threshold t using (run_id)
    where x.cur_blocks = x.k and x.prev_blocks = x.k
    group by x.run_id
)
select
    r.run_id,
    'loss_decreasing' as "check",
    case when x.windows is null then 'skip' when x.windows_over > 0 then 'warn' else 'ok' end as status,
    x.worst as value,
    t.value as threshold,
    x.first_step as at_step,
    json_merge_patch(case when x.windows is null then json_object('reason', 'fewer than 2 x window_blocks blocks of steps with a loss')
         else json_object('windows', x.windows, 'windows_over', x.windows_over,
                          'loss_noise_sigma', t.sigma,
                          'measure', case when t.abs_max >= 0 then 'mean loss of the trailing window - mean loss of the window before it'
                                          else '(mean loss of the trailing window - of the window before it) / its standard error from the loss noise' end) end,
                     json_object('loss_unit', u.note))::varchar as evidence
from audit_runs r
join threshold t using (run_id)
left join rises x using (run_id)
left join run_loss_unit u using (run_id)
