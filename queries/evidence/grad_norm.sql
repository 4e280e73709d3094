-- Grad-norm evidence for one run ($run_id): the trailing window of steps, its slope, and how much of
-- the window goes up step over step (a trend, not one spike).
with w as (
    select step, grad_norm from steps where run_id = $run_id and grad_norm is not null
    order by step desc limit $window
), d as (
    select step, grad_norm, grad_norm - lag(grad_norm) over (order by step) as diff from w
)
select max(step) as step, max(grad_norm) as max_grad_norm, arg_max(grad_norm, step) as last_grad_norm,
       regr_slope(grad_norm, step) as slope, count(*) as n,
       avg(case when diff > 0 then 1.0 else 0.0 end) filter (where diff is not null) as rising_frac
from d
