-- Is MFU constant: does any block's mean MFU (else tokens/s) stray from the run's median block by more than mfu_variation_max?
with threshold as (
    select run_id, value from run_thresholds where name = 'mfu_variation_max'
), measured as (
    -- each attempt's first block is left out: it holds compilation and warm-up
    select
        b.run_id, b.block, b.step_lo,
        case when b.mfu_n > 0 then b.mfu_mean else b.tps_mean end as throughput,
        case when b.mfu_n > 0 then 'mfu' else 'tokens_per_s' end as measure
    from step_blocks b
    where (b.mfu_n > 0 or b.tps_n > 0)
      and b.block > (select min(c.block) from step_blocks c where c.run_id = b.run_id and c.attempt = b.attempt)
), centred as (
    select *, median(throughput) over (partition by run_id) as run_median from measured
), summary as (
    select
        c.run_id, count(*) as blocks, max(abs(c.throughput / c.run_median - 1)) as worst,
        any_value(c.measure) as measure, any_value(c.run_median) as run_median,
        count(*) filter (abs(c.throughput / c.run_median - 1) > t.value) as blocks_off,
        min(c.step_lo) filter (abs(c.throughput / c.run_median - 1) > t.value) as first_step
    from centred c
    join threshold t using (run_id)
    where c.run_median > 0
    group by c.run_id
)
select
    r.run_id,
    'mfu_constant' as "check",
    case when coalesce(s.blocks, 0) < 2 then 'skip' when s.blocks_off > 0 then 'warn' else 'ok' end as status,
    s.worst as value,
    t.value as threshold,
    s.first_step as at_step,
    case when coalesce(s.blocks, 0) < 2 then json_object('reason', 'fewer than 2 blocks with mfu or tokens_per_s after the first')
         else json_object('blocks', s.blocks, 'blocks_off', s.blocks_off, 'median', s.run_median,
                          'measure', '|block mean ' || s.measure || ' / run median - 1|') end::varchar as evidence
from audit_runs r
join threshold t using (run_id)
left join summary s using (run_id)
