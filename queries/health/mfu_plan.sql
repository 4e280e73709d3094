-- Is throughput up to plan: is any block's FLOP rate (else tokens/s, else MFU) below the rate the run has shown, the median of its blocks before it, by more than mfu_below_own_tol and mfu_below_plan_sigma x its noise (default), or below the plan in run_started by more than mfu_below_plan_tol (Marin: MFU below plan)?
--
-- By default the plan is the run's own: a plan's peak is often made up (a CPU run planned against 1e11
-- FLOP/s), and a run held to the rate it has already shown is held to what it can do.
--
-- The plan is a FLOP rate, planned_tokens_per_s x flops_per_token of the attempt's run_started (both at
-- the length it started at). A block's FLOP rate is its mean mfu x the attempt's measured peak_flops, where
-- each step's mfu counts the FLOPs per token at the length it trained at: after a context extension a
-- token costs more attention FLOPs, so tokens/s falls on a healthy run while the FLOP rate holds.
-- Without those fields (a run logged by hand): tokens/s against planned tokens/s, else mfu against config.planned_mfu.
with tolerance as (
    -- the form in force: Marin's plan when mfu_below_plan_tol is on, else the run's own rate
    select
        run_id,
        case when max(value) filter (where name = 'mfu_below_plan_tol') >= 0
             then max(value) filter (where name = 'mfu_below_plan_tol')
             else max(value) filter (where name = 'mfu_below_own_tol') end as value,
        max(value) filter (where name = 'mfu_below_plan_tol') >= 0 as by_plan
    from run_thresholds
    where name in ('mfu_below_plan_tol', 'mfu_below_own_tol')
    group by run_id
), k as (
    select run_id, value from run_thresholds where name = 'mfu_below_plan_sigma'
), per_step as (
    select run_id, coalesce(mfu, tokens_per_s) as x,
           median(coalesce(mfu, tokens_per_s)) over (partition by run_id) as mid
    from steps_all where coalesce(mfu, tokens_per_s) > 0
), spread as (
    -- the run's own step-to-step spread of its rate: a robust coefficient of variation (as health/mfu_constant)
    select run_id, 1.4826 * median(abs(x / mid - 1)) as cv from per_step group by run_id
), attempt_plan as (
    select run_id, attempt, arg_max(peak_flops, seq) as peak_flops, arg_max(flops_per_token, seq) as flops_per_token,
           arg_max(planned_tokens_per_s, seq) as planned_tokens_per_s
    from runs
    group by run_id, attempt
), measured as (
    -- each attempt's first block is left out: it holds compilation and warm-up. `rate` is the block's own
    -- FLOP rate (else tokens/s, else MFU), for the default form; `of_plan` its share of the plan, for Marin's
    select
        b.run_id, b.attempt, b.block, b.step_lo, greatest(b.mfu_n, b.tps_n) as n,
        case when a.peak_flops > 0 and b.mfu_n > 0 then b.mfu_mean * a.peak_flops
             when b.tps_n > 0 then b.tps_mean
             when b.mfu_n > 0 then b.mfu_mean end as rate,
        case when a.peak_flops > 0 and b.mfu_n > 0 then 'mfu x peak_flops'
             when b.tps_n > 0 then 'tokens_per_s'
             when b.mfu_n > 0 then 'mfu' end as rate_measure,
        case when a.peak_flops > 0 and a.flops_per_token > 0 and a.planned_tokens_per_s > 0 and b.mfu_n > 0
                  then b.mfu_mean * a.peak_flops / (a.planned_tokens_per_s * a.flops_per_token)
             when p.planned_tokens_per_s > 0 and b.tps_n > 0 then b.tps_mean / p.planned_tokens_per_s
             when p.planned_mfu > 0 and b.mfu_n > 0 then b.mfu_mean / p.planned_mfu end as plan_share,
        case when a.peak_flops > 0 and a.flops_per_token > 0 and a.planned_tokens_per_s > 0 and b.mfu_n > 0
                  then 'mfu x peak_flops / (planned_tokens_per_s x flops_per_token)'
             when p.planned_tokens_per_s > 0 and b.tps_n > 0 then 'tokens_per_s / planned_tokens_per_s'
             when p.planned_mfu > 0 and b.mfu_n > 0 then 'mfu / config.planned_mfu' end as plan_measure
    from step_blocks b
    join run_plan p using (run_id)
    left join attempt_plan a on a.run_id = b.run_id and a.attempt = b.attempt
    where b.block > (select min(c.block) from step_blocks c where c.run_id = b.run_id and c.attempt = b.attempt)
), own as (
    -- a block against the median of the run's blocks before it (of the same measure), once 5 are there; a
    -- resumed run's attempts hold blocks of the same number: the earlier attempt's first, so the frame is one order
    select
        *,
        median(rate) over before as own_rate,
        count(rate) over before as history
    from measured
    window before as (partition by run_id, rate_measure order by block, attempt rows between unbounded preceding and 1 preceding)
), shared as (
    select
        o.run_id, o.block, o.step_lo, o.n,
        case when t.by_plan then o.plan_share when o.history >= 5 and o.own_rate > 0 then o.rate / o.own_rate end as of_plan,
        case when t.by_plan then o.plan_measure else o.rate_measure || ' / the median of the run''s blocks before it' end as measure
    from own o
    join tolerance t using (run_id)
), summary as (
    select
        m.run_id, count(*) as blocks, min(m.of_plan) as worst, any_value(m.measure) as measure,
        count(*) filter (m.of_plan < 1 - t.value - greatest(k.value, 0) * coalesce(s.cv, 0) / sqrt(m.n)) as blocks_under,
        min(m.step_lo) filter (m.of_plan < 1 - t.value - greatest(k.value, 0) * coalesce(s.cv, 0) / sqrt(m.n)) as first_step
    from shared m
    join tolerance t using (run_id)
    join k using (run_id)
    left join spread s using (run_id)
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
    case when s.blocks is null and t.by_plan then json_object('reason', 'no plan (run_started.planned_tokens_per_s or config.planned_mfu) or no measured throughput after the first block')
         when s.blocks is null then json_object('reason', 'fewer than 6 blocks of measured throughput after the first')
         else json_object('blocks', s.blocks, 'blocks_under', s.blocks_under, 'measure', 'block mean ' || s.measure) end::varchar as evidence
from audit_runs r
join tolerance t using (run_id)
left join summary s using (run_id)
