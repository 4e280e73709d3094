-- Does the fork drop more tokens than its parent: over the window, is its mean drop fraction above the parent's by more than fork_drop_fraction_rise_max?
with threshold as (
    select run_id, value from run_thresholds where name = 'fork_drop_fraction_rise_max'
), latest as (  -- each run's drops per step, the latest attempt's
    select run_id, step, drop_fraction from drops
    qualify row_number() over (partition by run_id, step order by attempt desc, seq desc) = 1
), means as (
    select
        w.run_id, any_value(w.parent_run) as parent_run, count(*) as n, min(w.step) as step_lo, max(w.step) as step_hi,
        avg(a.drop_fraction order by w.step) as fork_drops, avg(b.drop_fraction order by w.step) as parent_drops
    from fork_window w
    join latest a on a.run_id = w.run_id and a.step = w.step
    join latest b on b.run_id = w.parent_run and b.step = w.step
    group by w.run_id
)
select
    r.run_id,
    'fork_drop_fraction' as "check",
    case when m.n is null then 'skip' when m.fork_drops - m.parent_drops > t.value then 'warn' else 'ok' end as status,
    m.fork_drops - m.parent_drops as value,
    t.value as threshold,
    m.step_hi as at_step,
    case when m.n is null then json_object('reason', 'not a fork, or no step of the window with drops in it and its parent')
         else json_object('parent', m.parent_run, 'window', 'steps ' || m.step_lo || '..' || m.step_hi, 'steps', m.n,
                          'fork_drop_fraction', m.fork_drops, 'parent_drop_fraction', m.parent_drops,
                          'measure', 'fork mean drop fraction - parent mean drop fraction over the window') end::varchar as evidence
from audit_runs r
join threshold t using (run_id)
left join means m using (run_id)
