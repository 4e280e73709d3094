-- Forecast evidence for one run ($run_id): the latest fraction reached, observed loss there against
-- the ladder's projected loss and band.
with f as (
    select fraction, target_tokens, projected_loss, band_low, band_high
    from forecasts where target_run = $run_id
    qualify row_number() over (partition by fraction order by stream_seq desc) = 1
), seen as (
    select max(step) as step, sum(tokens) as tokens_seen from steps where run_id = $run_id
), observed as (  -- mean loss of the last few steps
    select avg(loss) as loss from (select loss from steps where run_id = $run_id and loss is not null
                                   order by step desc limit 10)
)
select f.fraction, f.projected_loss, f.band_low, f.band_high, o.loss as observed_loss, s.step, s.tokens_seen
from f, seen s, observed o
where f.target_tokens <= s.tokens_seen
order by f.fraction desc
limit 1
