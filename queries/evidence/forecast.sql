-- Forecast evidence for one run ($run_id): the latest fraction reached of the plan in force (the
-- registered forecast, or the revision of the latest plan change that began before what the run has
-- seen), observed loss there against the projected loss and band.
with f as (
    select
        fraction, target_tokens, projected_loss, band_low, band_high,
        coalesce((payload ->> 'revision')::bigint, 0) as revision, payload ->> 'decision_id' as decision_id,
        coalesce((payload ->> 'from_tokens')::bigint, 0) as from_tokens,
        coalesce((payload ->> 'supported')::boolean, true) as supported
    from forecasts where target_run = $run_id
    qualify row_number() over (partition by coalesce(payload ->> 'decision_id', ''), fraction order by stream_seq desc) = 1
), seen as (
    select max(step) as step, sum(tokens) as tokens_seen from steps where run_id = $run_id
), in_force as (  -- the plan that began last, before the tokens seen
    select f.decision_id from f, seen s where f.from_tokens < s.tokens_seen
    order by f.from_tokens desc limit 1
), observed as (  -- mean loss of the last few steps
    select avg(loss) as loss from (select loss from steps where run_id = $run_id and loss is not null
                                   order by step desc limit 10)
)
select f.fraction, f.revision, f.decision_id, f.projected_loss, f.band_low, f.band_high, o.loss as observed_loss,
       s.step, s.tokens_seen
from f, seen s, observed o, in_force i
where f.target_tokens <= s.tokens_seen and f.target_tokens > f.from_tokens and f.supported
  and f.decision_id is not distinct from i.decision_id
order by f.fraction desc
limit 1
