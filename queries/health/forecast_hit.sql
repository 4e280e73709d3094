-- Was the projected loss hit at each 5% of training, by the forecast of the plan in force there?
--
-- Inside the band means the observed loss lies between band_low and band_high (an ASOF join).
--
-- Observed: the mean training loss of the last block (block_steps steps) ending at or before the
-- forecast's point, target_tokens or fraction x token_budget. Each point is judged against the plan
-- that governed the run there (forecast_points.in_force: the registered plan until a decision changed
-- it, then that decision's revision); a point of a plan not in force there, or one the ladder says it
-- cannot speak for (supported false), is not judged. Above the band fails; below it warns (the run
-- beat the forecast: the forecast is off). Points the run has not reached yet are left out. The
-- evidence says which plans were judged (revision, decision) and which one is in force now.
with reached as (
    select run_id, max(tokens_seen) as tokens_seen from step_progress group by run_id
), observed as (
    select
        f.*, o.step_hi as at_step, o.loss_mean as observed_loss,
        o.loss_mean - f.projected_loss as residual
    from forecast_points f
    join reached x on x.run_id = f.run_id and x.tokens_seen >= f.at_tokens
    asof join step_progress o on o.run_id = f.run_id and o.tokens_seen <= f.at_tokens
    where f.in_force and f.supported
), per_plan as (
    select
        run_id, revision, decision_id, count(*) as points,
        count(*) filter (observed_loss > band_high or observed_loss < band_low) as missed
    from observed
    group by all
), plans as (
    select run_id, list(json_object('revision', revision, 'decision_id', decision_id, 'points', points,
                                    'missed', missed) order by revision) as judged
    from per_plan group by run_id
), now_in_force as (  -- the plan governing the run at the last point it reached
    select run_id, arg_max(json_object('revision', revision, 'decision_id', decision_id), at_tokens) as plan
    from observed group by run_id
), summary as (
    select
        run_id, count(*) as points, max(residual) as worst,
        count(*) filter (observed_loss > band_high) as above,
        count(*) filter (observed_loss < band_low) as below,
        min(at_step) filter (observed_loss > band_high or observed_loss < band_low) as first_step,
        arg_min(fraction, at_step) filter (observed_loss > band_high or observed_loss < band_low) as first_fraction,
        arg_min(revision, at_step) filter (observed_loss > band_high or observed_loss < band_low) as first_revision
    from observed
    group by run_id
), made as (
    select run_id, count(*) as forecasts, count(distinct revision) as plans from forecast_points group by run_id
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
         when s.points is null then json_object('reason', 'the run has not reached a forecast point of a plan in force yet',
                                                'forecasts', m.forecasts, 'plans', m.plans)
         else json_object('points', s.points, 'above_band', s.above, 'below_band', s.below,
                          'first_miss_fraction', s.first_fraction, 'first_miss_revision', s.first_revision,
                          'plan_in_force', n.plan, 'plans_judged', p.judged,
                          'measure', 'observed - projected loss (max), each point against the plan in force there')
    end::varchar as evidence
from audit_runs r
left join made m using (run_id)
left join summary s using (run_id)
left join plans p using (run_id)
left join now_in_force n using (run_id)
