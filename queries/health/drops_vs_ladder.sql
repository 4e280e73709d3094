-- Do the run's token drops track its ladder's rungs at the same fraction of training (per 5% of the horizon)?
with ratio as (
    select run_id, value from run_thresholds where name = 'drops_vs_ladder_ratio'
), min_diff as (
    select run_id, value from run_thresholds where name = 'drops_vs_ladder_min_diff'
), binned as (
    -- mean drop fraction per 5% of each run's horizon (step / horizon_steps)
    select d.run_id, least(floor(20.0 * d.step / p.horizon_steps), 19)::int as bin,
           avg(d.drop_fraction) as drop_fraction, min(d.step) as first_step
    from drops d
    join run_plan p using (run_id)
    where p.horizon_steps > 0
    group by all
), ladder as (
    select p.run_id, b.bin, max(b.drop_fraction) as ladder_fraction, count(distinct b.run_id) as rungs
    from ladder_peers p
    join binned b on b.run_id = p.peer
    group by all
), compared as (
    select
        b.run_id, b.bin, b.first_step, b.drop_fraction, l.ladder_fraction, l.rungs,
        b.drop_fraction > t.value * l.ladder_fraction and b.drop_fraction - l.ladder_fraction > m.value as worse
    from binned b
    join ladder l using (run_id, bin)
    join ratio t using (run_id)
    join min_diff m using (run_id)
), summary as (
    select
        run_id, count(*) as bins, count(*) filter (worse) as bins_over,
        min(first_step) filter (worse) as first_step,
        max(drop_fraction / nullif(ladder_fraction, 0)) as worst_ratio, max(rungs) as rungs
    from compared
    group by run_id
), has_drops as (
    select distinct run_id from drops
)
select
    r.run_id,
    'drops_vs_ladder' as "check",
    case when s.bins is null then 'skip' when s.bins_over > 0 then 'warn' else 'ok' end as status,
    s.worst_ratio as value,
    t.value as threshold,
    s.first_step as at_step,
    case when h.run_id is null then json_object('reason', 'no drops events')
         when s.bins is null then json_object('reason', 'no ladder rungs with drops at the same fractions of training')
         else json_object('bins_compared', s.bins, 'bins_over', s.bins_over, 'rungs', s.rungs,
                          'rule', 'over when drop fraction > ratio x the ladder''s and above it by > drops_vs_ladder_min_diff') end::varchar as evidence
from audit_runs r
join ratio t using (run_id)
left join summary s using (run_id)
left join has_drops h using (run_id)
