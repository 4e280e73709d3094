-- Observed vs projected loss at each 5% of the plan's horizon: the plan as registered (revision 0),
-- then each revision with the decision that caused it; residual and inside the band or not for the
-- points where their plan was in force (an ASOF join). band_level: the band's nominal coverage (0.95 a 95%
-- band), as the forecast stated it; null where it stated none.
--
-- Observed: the mean training loss of the last block (block_steps steps) ending at or before the
-- point (target_tokens, else fraction x the target run's token_budget); the latest forecast per
-- (target run, plan, fraction). A point the run has not reached yet has no observation; a point the
-- run reached under another plan (in_force false) shows what was observed there, and is not judged.
with reached as (
    select run_id, max(tokens_seen) as tokens_seen from step_progress group by run_id
), observed as (
    select f.*, o.step_hi, o.loss_mean, o.tokens_seen as observed_tokens
    from forecast_points f
    asof left join step_progress o on o.run_id = f.run_id and o.tokens_seen <= f.at_tokens
)
select
    o.run_id, o.revision, o.decision_id, o.fraction, o.at_tokens, o.projected_loss, o.band_low, o.band_high,
    o.band_level,
    case when x.tokens_seen >= o.at_tokens then o.loss_mean end as observed_loss,
    case when x.tokens_seen >= o.at_tokens then o.step_hi end as at_step,
    case when x.tokens_seen >= o.at_tokens then o.loss_mean - o.projected_loss end as residual,
    case when x.tokens_seen >= o.at_tokens and o.in_force and o.supported
         then o.loss_mean between o.band_low and o.band_high end as inside_band,
    coalesce(x.tokens_seen >= o.at_tokens, false) as reached,
    o.in_force, o.supported, o.from_step,
    o.forecast_by_run, o.forecast_at, o.rungs, o.flags
from observed o
left join reached x using (run_id)
order by o.run_id, o.revision, o.fraction
