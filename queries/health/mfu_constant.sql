-- Is MFU constant: does any block's mean MFU (else tokens/s) stray from the run's median block by more than mfu_variation_max and, by default, by more than mfu_variation_sigma x the run's own step-to-step spread of it (its robust coefficient of variation / sqrt(steps in the block))?
with threshold as (
    select run_id, value from run_thresholds where name = 'mfu_variation_max'
), k as (
    select run_id, value from run_thresholds where name = 'mfu_variation_sigma'
), per_step as (
    select run_id, coalesce(mfu, tokens_per_s) as x,
           median(coalesce(mfu, tokens_per_s)) over (partition by run_id) as mid
    from steps_all where coalesce(mfu, tokens_per_s) > 0
), spread as (
    -- 1.4826 x the median absolute deviation of a step's rate over the run median: a robust coefficient of variation
    select run_id, 1.4826 * median(abs(x / mid - 1)) as cv from per_step group by run_id
), measured as (
    -- each attempt's first block is left out: it holds compilation and warm-up
    select
        b.run_id, b.block, b.step_lo, greatest(b.mfu_n, b.tps_n) as n,
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
        count(*) filter (abs(c.throughput / c.run_median - 1) > t.value
                         and (k.value < 0 or abs(c.throughput / c.run_median - 1) > k.value * s.cv / sqrt(c.n))) as blocks_off,
        min(c.step_lo) filter (abs(c.throughput / c.run_median - 1) > t.value
                               and (k.value < 0 or abs(c.throughput / c.run_median - 1) > k.value * s.cv / sqrt(c.n))) as first_step,
        any_value(s.cv) as cv
    from centred c
    join threshold t using (run_id)
    join k using (run_id)
    left join spread s using (run_id)
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
         else json_object('blocks', s.blocks, 'blocks_off', s.blocks_off, 'median', s.run_median, 'step_cv', s.cv,
                          'measure', '|block mean ' || s.measure || ' / run median - 1|') end::varchar as evidence
from audit_runs r
join threshold t using (run_id)
left join summary s using (run_id)
