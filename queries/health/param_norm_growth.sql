-- Is the parameter norm growing too fast: its relative growth across a trailing window of window_blocks blocks?
with threshold as (
    select run_id, value from run_thresholds where name = 'param_norm_growth_max'
), width as (
    select run_id, value::bigint as k from run_thresholds where name = 'window_blocks'
), trailing_window as (
    select
        b.run_id, b.attempt, b.block, b.step_hi, w.k,
        count(*) over win as blocks,
        first_value(b.p_first) over win as start_norm,
        b.p_last as end_norm
    from step_blocks b
    join width w using (run_id)
    where b.p_n > 0
    window win as (partition by b.run_id, b.attempt order by b.block rows between w.k - 1 preceding and current row)
), growth as (
    select
        g.run_id, count(*) as windows, max(g.end_norm / g.start_norm - 1) as worst,
        count(*) filter (g.end_norm / g.start_norm - 1 > t.value) as windows_over,
        min(g.step_hi) filter (g.end_norm / g.start_norm - 1 > t.value) as first_step
    from trailing_window g
    join threshold t using (run_id)
    where g.blocks = g.k and g.start_norm > 0
    group by g.run_id
)
select
    r.run_id,
    'param_norm_growth' as "check",
    case when g.windows is null then 'skip' when g.windows_over > 0 then 'warn' else 'ok' end as status,
    g.worst as value,
    t.value as threshold,
    g.first_step as at_step,
    case when g.windows is null then json_object('reason', 'fewer than window_blocks blocks of steps with a param_norm')
         else json_object('windows', g.windows, 'windows_over', g.windows_over,
                          'measure', 'param_norm at the window end / at its start - 1') end::varchar as evidence
from audit_runs r
join threshold t using (run_id)
left join growth g using (run_id)
