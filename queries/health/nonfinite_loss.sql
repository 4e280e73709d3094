-- Was any loss NaN or infinite (a typed step sent as null and skipped, or a metrics loss named in `nonfinite`)?
with most as (
    select run_id, value from run_thresholds where name = 'nonfinite_loss_max'
), counted as (
    select run_id, count(*) as steps, count(*) filter (where skipped and loss is null) as nonfinite,
           min(step) filter (where skipped and loss is null) as first_step
    from steps_all
    group by run_id
)
select
    r.run_id,
    'nonfinite_loss' as "check",
    case when c.steps is null then 'skip' when c.nonfinite > m.value then 'fail' else 'ok' end as status,
    coalesce(c.nonfinite, 0)::double as value,
    m.value as threshold,
    c.first_step as at_step,
    case when c.steps is null then json_object('reason', 'no steps')
         else json_object('steps', c.steps, 'nonfinite_losses', c.nonfinite) end::varchar as evidence
from audit_runs r
join most m using (run_id)
left join counted c using (run_id)
