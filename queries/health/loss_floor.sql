-- Did the loss floor jump: a block whose lowest loss is above the lowest loss before it (same attempt) by more than loss_floor_sigma x the run's loss noise (default), or by more than loss_floor_rise_max (Marin checklist: 1.0)?
with th as (
    select
        run_id,
        max(value) filter (where name = 'loss_floor_rise_max') as abs_max,
        max(value) filter (where name = 'loss_floor_sigma') as k
    from run_thresholds
    group by run_id
), threshold as (
    select t.run_id, t.abs_max, t.k, n.sigma, case when t.abs_max >= 0 then t.abs_max else t.k end as value
    from th t left join loss_noise n using (run_id)
), floors as (
    select
        run_id, attempt, block, step_lo, l_min,
        min(l_min) over (partition by run_id, attempt order by block
                         rows between unbounded preceding and 1 preceding) as trailing_floor
    from step_blocks
    where l_n > 0
), jumps as (
    select
        f.run_id, count(*) as blocks,
        max(case when t.abs_max >= 0 then f.l_min - f.trailing_floor else (f.l_min - f.trailing_floor) / nullif(t.sigma, 0) end) as worst,
        count(*) filter (t.abs_max >= 0 and f.l_min - f.trailing_floor > t.abs_max
                         or t.k >= 0 and f.l_min - f.trailing_floor > t.k * t.sigma) as blocks_over,
        min(f.step_lo) filter (t.abs_max >= 0 and f.l_min - f.trailing_floor > t.abs_max
                               or t.k >= 0 and f.l_min - f.trailing_floor > t.k * t.sigma) as first_step
    from floors f
    join threshold t using (run_id)
    where f.trailing_floor is not null
    group by f.run_id
)
select
    r.run_id,
    'loss_floor' as "check",
    case when j.blocks is null then 'skip' when j.blocks_over > 0 then 'fail' else 'ok' end as status,
    j.worst as value,
    t.value as threshold,
    j.first_step as at_step,
    json_merge_patch(case when j.blocks is null then json_object('reason', 'fewer than two blocks of steps with a loss')
         else json_object('blocks', j.blocks, 'blocks_over', j.blocks_over,
                          'loss_noise_sigma', t.sigma,
                          'measure', case when t.abs_max >= 0 then 'min loss of a block - min loss of the blocks before it'
                                          else '(min loss of a block - min loss of the blocks before it) / the run''s loss noise sigma' end) end,
                     json_object('loss_unit', u.note))::varchar as evidence
from audit_runs r
join threshold t using (run_id)
left join jumps j using (run_id)
left join run_loss_unit u using (run_id)
