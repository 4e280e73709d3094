-- Does the router spread tokens near evenly: is the mean router entropy of every block after warmup above router_entropy_min_ratio x its maximum ln E (default 0.8; Marin 0.995)?
with ratio as (
    select run_id, value from run_thresholds where name = 'router_entropy_min_ratio'
), settle as (
    select run_id, value from run_thresholds where name = 'router_entropy_settle_warmups'
), measured as (
    select
        b.run_id, count(*) as blocks, min(b.re_mean / ln(p.n_experts)) as worst,
        count(*) filter (b.re_mean < t.value * ln(p.n_experts)) as blocks_under,
        min(b.step_lo) filter (b.re_mean < t.value * ln(p.n_experts)) as first_step,
        any_value(p.n_experts) as n_experts
    from step_blocks b
    join run_plan p using (run_id)
    join ratio t using (run_id)
    join settle w using (run_id)
    where b.re_n > 0 and p.n_experts > 1 and b.step_lo > w.value * coalesce(p.warmup_steps, 0)
    group by b.run_id
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
                          'measure', 'block mean router_entropy / ln(n_experts), blocks from router_entropy_settle_warmups x warmup_steps on') end::varchar as evidence
from audit_runs r
join ratio t using (run_id)
left join measured m using (run_id)
left join reported e using (run_id)
