-- Is throughput up to plan: is any block's mean tokens/s (or MFU) below the plan in run_started (Marin: MFU below plan)?
with tolerance as (
    select run_id, value from run_thresholds where name = 'mfu_below_plan_tol'
), measured as (
    -- each attempt's first block is left out: it holds compilation and warm-up
    select
        b.run_id, b.block, b.step_lo,
        case when p.planned_tokens_per_s > 0 and b.tps_n > 0 then b.tps_mean / p.planned_tokens_per_s
             when p.planned_mfu > 0 and b.mfu_n > 0 then b.mfu_mean / p.planned_mfu end as of_plan,
        case when p.planned_tokens_per_s > 0 and b.tps_n > 0 then 'tokens_per_s / planned_tokens_per_s'
             when p.planned_mfu > 0 and b.mfu_n > 0 then 'mfu / config.planned_mfu' end as measure
    from step_blocks b
    join run_plan p using (run_id)
    where b.block > (select min(c.block) from step_blocks c where c.run_id = b.run_id and c.attempt = b.attempt)
), summary as (
    select
        m.run_id, count(*) as blocks, min(m.of_plan) as worst, any_value(m.measure) as measure,
        count(*) filter (m.of_plan < 1 - t.value) as blocks_under,
        min(m.step_lo) filter (m.of_plan < 1 - t.value) as first_step
    from measured m
    join tolerance t using (run_id)
    where m.of_plan is not null
    group by m.run_id
)
select
    r.run_id,
    'mfu_below_plan' as "check",
    case when s.blocks is null then 'skip' when s.blocks_under > 0 then 'fail' else 'ok' end as status,
    s.worst as value,
    1 - t.value as threshold,
    s.first_step as at_step,
    case when s.blocks is null then json_object('reason', 'no plan (run_started.planned_tokens_per_s or config.planned_mfu) or no measured throughput after the first block')
         else json_object('blocks', s.blocks, 'blocks_under', s.blocks_under, 'measure', 'block mean ' || s.measure) end::varchar as evidence
from audit_runs r
join tolerance t using (run_id)
left join summary s using (run_id)
