-- Did the MoE transport drop more than its alert share of token assignments in any step (Marin: > 7%)?
with threshold as (
    select run_id, value from run_thresholds where name = 'drop_fraction_max'
), observed as (
    select
        d.run_id, count(*) as n, max(d.drop_fraction) as worst,
        count(*) filter (d.drop_fraction > t.value) as steps_over,
        min(d.step) filter (d.drop_fraction > t.value) as first_step,
        sum(d.dropped) as dropped, sum(d.assignments) as assignments
    from drops d
    join threshold t using (run_id)
    group by d.run_id
)
select
    r.run_id,
    'drop_fraction' as "check",
    case when o.n is null then 'skip' when o.steps_over > 0 then 'fail' else 'ok' end as status,
    o.worst as value,
    t.value as threshold,
    o.first_step as at_step,
    case when o.n is null then json_object('reason', 'no drops events')
         else json_object('steps_over', o.steps_over, 'drop_events', o.n,
                          'overall_fraction', o.dropped / nullif(o.assignments, 0)) end::varchar as evidence
from audit_runs r
join threshold t using (run_id)
left join observed o using (run_id)
