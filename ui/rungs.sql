-- The rungs of ladder $ladder: each run with its place on the ladder, tokens trained, the FLOPs they
-- cost (tokens x the declared training flops_per_token) and its final loss (the mean of its last 5% of steps,
-- the latest attempt's).
with rung as (
    select run_id, arg_min(ladder ->> 'rung', ts)::bigint as rung, arg_min(preset, ts) as preset,
           arg_min(ladder ->> 'target', ts) as target, max(flops_per_token) as flops_per_token
    from runs where ladder ->> 'name' = $ladder group by run_id
), trained as (
    select run_id, sum(tokens) as tokens, max(step) as last_step,
           avg(loss) filter (step >= 0.95 * last) as final_loss
    from (select *, max(step) over (partition by run_id) as last from steps where run_id in (select run_id from rung))
    group by run_id
)
select r.run_id, r.rung, r.preset, r.target, t.tokens, t.last_step, t.final_loss,
       t.tokens * r.flops_per_token as flops
from rung r left join trained t using (run_id)
order by r.rung nulls last, r.run_id
