-- Throughput evidence for one run ($run_id): how far it is, how fast it goes now, what was planned.
-- With FLOPs per token recorded (run_started, and each step at the length it trained at), the plan is a
-- FLOP rate, planned_tokens_per_s x planned_flops_per_token: a context extension makes tokens dearer.
with attempt_starts as (
    select attempt, min(ts) as started, arg_max(token_budget, seq) as token_budget,
           arg_max(tokens_per_step, seq) as tokens_per_step, arg_max(planned_tokens_per_s, seq) as planned_tokens_per_s,
           arg_max(deadline_s, seq) as deadline_s, arg_max(flops_per_token, seq) as planned_flops_per_token
    from runs where run_id = $run_id group by attempt
), plan as (
    select min(started) as started, arg_max(token_budget, attempt) as token_budget,
           arg_max(tokens_per_step, attempt) as tokens_per_step,
           arg_max(planned_tokens_per_s, attempt) as planned_tokens_per_s, arg_max(deadline_s, attempt) as deadline_s,
           arg_max(planned_flops_per_token, attempt) as planned_flops_per_token
    from attempt_starts
), progress as (  -- training time so far: the steps' own time (restarts and compiles excluded)
    select max(step) as step, sum(tokens) as tokens_seen, sum(step_time_s) as elapsed_s,
           case when count(flops_per_token) = count(*) then sum(tokens * flops_per_token) end as flops_seen,
           arg_max(flops_per_token, step) as flops_per_token_now
    from steps where run_id = $run_id
), recent as (  -- the trailing window of steps, by step, of the latest attempt
    select median(tokens / nullif(step_time_s, 0)) as recent_tokens_per_s, count(*) as recent_steps
    from (select * from steps where run_id = $run_id order by step desc limit $window)
)
select p.*, g.step, g.tokens_seen, g.elapsed_s, g.flops_seen, g.flops_per_token_now, r.recent_tokens_per_s, r.recent_steps
from plan p, progress g, recent r
where g.step is not null
