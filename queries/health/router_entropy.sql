-- Does the router spread tokens near evenly: is every block's mean router entropy, from router_entropy_settle_warmups x warmup on, above router_entropy_min_ratio x its maximum ln E (default 0.5; Marin 0.995) and, by default, not below router_entropy_drop_ratio (0.95) x the median of the blocks before it by more than router_entropy_drop_sigma (6) x the block-to-block noise (a fall from the run's own level that stands out of its noise)?
with ratio as (
    select run_id, value from run_thresholds where name = 'router_entropy_min_ratio'
), drop_ratio as (
    select run_id, value from run_thresholds where name = 'router_entropy_drop_ratio'
), drop_sigma as (
    select run_id, value from run_thresholds where name = 'router_entropy_drop_sigma'
), settle as (
    select run_id, value from run_thresholds where name = 'router_entropy_settle_warmups'
), settled as (
    select
        b.run_id, b.step_lo, b.re_mean, ln(p.n_experts) as ln_e, p.n_experts,
        median(b.re_mean) over before as running_median, count(*) over before as history,
        b.re_mean - lag(b.re_mean) over (partition by b.run_id, b.attempt order by b.block) as change
    from step_blocks b
    join run_plan p using (run_id)
    join settle w using (run_id)
    where b.re_n > 0 and p.n_experts > 1 and b.step_lo > w.value * coalesce(p.warmup_steps, 0)
    window before as (partition by b.run_id, b.attempt order by b.block rows between unbounded preceding and 1 preceding)
), noise as (
    -- a robust sigma of a block mean: 1.4826 x the MAD of the block-to-block changes / sqrt(2) (as views.sql loss_noise)
    select run_id, 1.4826 * median(abs(change - mid)) / sqrt(2) as sigma
    from (select run_id, change, median(change) over (partition by run_id) as mid from settled where change is not null)
    group by run_id
), blocks as (
    select x.*, n.sigma from settled x left join noise n using (run_id)
), judged as (
    select
        x.*,
        x.re_mean < t.value * x.ln_e
        or (d.value >= 0 and x.history >= 5 and x.re_mean < d.value * x.running_median
            and (k.value < 0 or x.running_median - x.re_mean > k.value * coalesce(x.sigma, 0))) as under
    from blocks x
    join ratio t using (run_id)
    join drop_ratio d using (run_id)
    join drop_sigma k using (run_id)
), measured as (
    select
        run_id, count(*) as blocks, min(re_mean / ln_e) as worst, min(re_mean / running_median) as worst_drop,
        max((running_median - re_mean) / nullif(sigma, 0)) as worst_drop_sigmas,
        count(*) filter (under) as blocks_under, min(step_lo) filter (under) as first_step,
        any_value(n_experts) as n_experts
    from judged
    group by run_id
), reported as (
    select run_id, sum(re_n) as n from step_blocks group by run_id
)
select
    r.run_id,
    'router_entropy' as "check",
    case when m.blocks is null then 'skip' when m.blocks_under > 0 then 'fail' else 'ok' end as status,
    m.worst as value,
    t.value as threshold,
    m.first_step as at_step,
    case when coalesce(e.n, 0) = 0 then json_object('reason', 'no step reports a router_entropy')
         when m.blocks is null then json_object('reason', 'the number of experts is not in run_started.config (moe.n_experts)')
         else json_object('blocks', m.blocks, 'blocks_under', m.blocks_under, 'ln_E', ln(m.n_experts),
                          'lowest_over_running_median', m.worst_drop, 'largest_fall_in_sigmas', m.worst_drop_sigmas,
                          'measure', 'block mean router_entropy / ln(n_experts), blocks from router_entropy_settle_warmups x warmup_steps on') end::varchar as evidence
from audit_runs r
join ratio t using (run_id)
left join measured m using (run_id)
left join reported e using (run_id)
