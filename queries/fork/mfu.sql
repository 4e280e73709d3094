-- Does the fork keep its parent's MFU: over the window, is its mean MFU below the parent's by more than fork_mfu_drop_max of it?
with threshold as (
    select run_id, value from run_thresholds where name = 'fork_mfu_drop_max'
), means as (
    select
        run_id, any_value(parent_run) as parent_run, count(*) as n, min(step) as step_lo, max(step) as step_hi,
        avg(mfu order by step) as fork_mfu, avg(parent_mfu order by step) as parent_mfu
    from fork_window
    where mfu is not null and parent_mfu is not null
    group by run_id
)
select
    r.run_id,
    'fork_mfu' as "check",
    case when m.n is null or m.parent_mfu <= 0 then 'skip'
         when (m.parent_mfu - m.fork_mfu) / m.parent_mfu > t.value then 'fail' else 'ok' end as status,
    (m.fork_mfu - m.parent_mfu) / nullif(m.parent_mfu, 0) as value,
    t.value as threshold,
    m.step_hi as at_step,
    case when m.n is null then json_object('reason', 'not a fork, or no step after its fork point with an MFU in it and its parent')
         else json_object('parent', m.parent_run, 'window', 'steps ' || m.step_lo || '..' || m.step_hi, 'steps', m.n,
                          'fork_mfu', m.fork_mfu, 'parent_mfu', m.parent_mfu,
                          'measure', '(fork mean MFU - parent mean MFU) / parent mean MFU over the window') end::varchar as evidence
from audit_runs r
join threshold t using (run_id)
left join means m using (run_id)
