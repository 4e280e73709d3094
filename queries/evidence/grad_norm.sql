-- Grad-norm evidence for one run ($run_id): the trailing $window steps (their largest grad norm, and
-- the largest after warmup against the median of the steps after warmup before them: the audit's
-- default spike rule, health/grad_norm_spike, on the latest window), and
-- the latest trailing window of the "grad norm rising" rule (views.sql grad_norm_rise: window_blocks
-- blocks of block_steps steps with a grad norm, as health/grad_norm_trend takes every window).
with run_steps as materialized (
    select step, grad_norm from steps where run_id = $run_id and grad_norm is not null
), warmup as (
    select coalesce(max(warmup_steps), 0) as steps from run_plan where run_id = $run_id
), latest as (
    select max(step) as step, max(grad_norm) as max_grad_norm, arg_max(grad_norm, step) as last_grad_norm,
           count(*) as n, min(step) as window_from,
           max(grad_norm) filter (where step > (select steps from warmup)) as max_after_warmup
    from (select * from run_steps order by step desc limit $window)
), settled as (
    select median(s.grad_norm) as running_median, count(*) as history
    from run_steps s, latest l
    where s.step > (select steps from warmup) and s.step < l.window_from
), width as (
    select b.block_steps, t.value::bigint as k
    from run_blocks b
    join run_thresholds t on t.run_id = b.run_id and t.name = 'window_blocks'
    where b.run_id = $run_id
), blocks as (
    select s.step, s.grad_norm, w.k, dense_rank() over (order by (s.step - 1) // w.block_steps desc) as back
    from run_steps s, width w
), rising as (
    select
        min(step) as rise_from_step, max(step) as rise_step,
        case when max(back) = any_value(k) and count(*) > 2
             then grad_norm_rise(regr_slope(grad_norm, step), min(step), max(step), avg(grad_norm)) end as rise
    from blocks
    where back <= k
)
select * from latest, settled, rising
