-- Was the projected loss hit at each 5% of training: is the observed loss inside the forecast's band (an ASOF join)?
--
-- Observed: the mean training loss of the last block (block_steps steps) ending at or before the
-- forecast's point, target_tokens or fraction x token_budget. Above the band fails; below it warns
-- (the run beat the forecast: the forecast is off). Points the run has not reached yet are left out.
with reached as (
    select run_id, max(tokens_seen) as tokens_seen from step_progress group by run_id
), observed as (
    select
        f.*, o.step_hi as at_step, o.loss_mean as observed_loss,
        o.loss_mean - f.projected_loss as residual
    from forecast_points f
    join reached x on x.run_id = f.run_id and x.tokens_seen >= f.at_tokens
    asof join step_progress o on o.run_id = f.run_id and o.tokens_seen <= f.at_tokens
), summary as (
    select
        run_id, count(*) as points, max(residual) as worst,
        count(*) filter (observed_loss > band_high) as above,
        count(*) filter (observed_loss < band_low) as below,
        min(at_step) filter (observed_loss > band_high or observed_loss < band_low) as first_step,
        arg_min(fraction, at_step) filter (observed_loss > band_high or observed_loss < band_low) as first_fraction
    from observed
    group by run_id
), made as (
    select run_id, count(*) as forecasts from forecast_points group by run_id
)
select
    r.run_id,
    'forecast_hit' as "check",
    case when m.forecasts is null or s.points is null then 'skip'
         when s.above > 0 then 'fail' when s.below > 0 then 'warn' else 'ok' end as status,
    s.worst as value,
    null::double as threshold,
    s.first_step as at_step,
    case when m.forecasts is null then json_object('reason', 'no forecast events target this run')
         when s.points is null then json_object('reason', 'the run has not reached a forecast point yet', 'forecasts', m.forecasts)
         else json_object('points', s.points, 'above_band', s.above, 'below_band', s.below,
                          'first_miss_fraction', s.first_fraction,
                          'measure', 'observed - projected loss (max)') end::varchar as evidence
from audit_runs r
left join made m using (run_id)
left join summary s using (run_id)
