-- Did the loss floor jump: a block whose lowest loss is more than 1.0 above the lowest loss before it (same attempt)?
with threshold as (
    select run_id, value from run_thresholds where name = 'loss_floor_rise_max'
), floors as (
    select
        run_id, attempt, block, step_lo, l_min,
        min(l_min) over (partition by run_id, attempt order by block
                         rows between unbounded preceding and 1 preceding) as trailing_floor
    from step_blocks
    where l_n > 0
), jumps as (
    select
        f.run_id, count(*) as blocks, max(f.l_min - f.trailing_floor) as worst,
        count(*) filter (f.l_min - f.trailing_floor > t.value) as blocks_over,
        min(f.step_lo) filter (f.l_min - f.trailing_floor > t.value) as first_step
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
    case when j.blocks is null then json_object('reason', 'fewer than two blocks of steps with a loss')
         else json_object('blocks', j.blocks, 'blocks_over', j.blocks_over,
                          'measure', 'min loss of a block - min loss of the blocks before it') end::varchar as evidence
from audit_runs r
join threshold t using (run_id)
left join jumps j using (run_id)
