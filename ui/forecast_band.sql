-- The forecast in force for a run's loss chart: each point of the plan that governed the run there
-- (views.sql forecast_points), at the step its tokens fall on. $run: the run id.
with plan as (
    select coalesce(max(tokens_per_step), 1) as tokens_per_step from runs where run_id = $run
)
select
    at_tokens / plan.tokens_per_step as step, fraction, projected_loss, band_low, band_high, band_level, revision, decision_id
from forecast_points, plan
where run_id = $run and in_force and at_tokens is not null
order by at_tokens
