-- Observed vs projected loss at each 5% of the token budget: residual and inside the band or not (an ASOF join).
--
-- Observed: the mean training loss of the last block (window_steps steps) ending at or before the
-- point (target_tokens, else fraction x the target run's token_budget); the latest forecast per
-- (target run, fraction). A point the run has not reached yet has no observation.
with forecast_points as (
    select
        f.target_run as run_id, f.fraction, f.projected_loss, f.band_low, f.band_high, f.rungs, f.flags,
        f.ts as forecast_at, f.run_id as forecast_by_run,
        coalesce(f.target_tokens, f.fraction * p.token_budget) as at_tokens
    from forecasts f
    left join run_plan p on p.run_id = f.target_run
    qualify row_number() over (partition by f.target_run, f.fraction order by f.ts desc, f.seq desc) = 1
), reached as (
    select run_id, max(tokens_seen) as tokens_seen from step_progress group by run_id
), observed as (
    select f.*, o.step_hi, o.loss_mean, o.tokens_seen as observed_tokens
    from forecast_points f
    asof left join step_progress o on o.run_id = f.run_id and o.tokens_seen <= f.at_tokens
)
select
    o.run_id, o.fraction, o.at_tokens, o.projected_loss, o.band_low, o.band_high,
    case when x.tokens_seen >= o.at_tokens then o.loss_mean end as observed_loss,
    case when x.tokens_seen >= o.at_tokens then o.step_hi end as at_step,
    case when x.tokens_seen >= o.at_tokens then o.loss_mean - o.projected_loss end as residual,
    case when x.tokens_seen >= o.at_tokens then o.loss_mean between o.band_low and o.band_high end as inside_band,
    coalesce(x.tokens_seen >= o.at_tokens, false) as reached,
    o.forecast_by_run, o.forecast_at, o.rungs, o.flags
from observed o
left join reached x using (run_id)
order by o.run_id, o.fraction
