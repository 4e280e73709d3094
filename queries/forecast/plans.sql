-- The plans the run's forecast was made for: the plan as registered (revision 0), then each revision
-- with the applied decision that caused it (who decided, what, why, applied before which step), its
-- horizon, its points, how many of them were in force, and whether the ladder can speak for it.
with points as (
    select
        run_id, revision, decision_id, any_value(from_step) as from_step,
        coalesce(any_value(horizon_tokens), max(at_tokens)) as horizon_tokens,
        count(*) as points, count(*) filter (in_force) as points_in_force,
        bool_and(supported) as supported, min(forecast_at) as forecast_at, any_value(rungs) as rungs
    from forecast_points
    group by all
)
select
    p.run_id, p.revision, p.decision_id, d.agent, d.action, d.params, a.step + 1 as applied_before_step,
    p.from_step, p.horizon_tokens, p.points, p.points_in_force, p.supported, p.forecast_at, d.rationale, p.rungs
from points p
left join decisions d on d.run_id = p.run_id and d.decision_id = p.decision_id
left join decisions_applied a on a.run_id = p.run_id and a.decision_id = p.decision_id and a.status = 'applied'
order by p.run_id, p.revision
