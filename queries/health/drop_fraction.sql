-- Did the MoE transport drop a step's token assignments out of line: by default, above the median of the attempt's steps before it (from drop_fraction_settle_warmups x warmup on) by more than drop_fraction_sigma x its step-to-step noise and drop_fraction_min_rise; in Marin's profile, above drop_fraction_max (7%)?
--
-- A run's own level is its norm: a toy MoE at capacity drops 20-58% of its assignments and a tuned one
-- under 1%. The noise is a robust sigma, 1.4826 x the median absolute deviation of the step-to-step
-- changes / sqrt(2) (as views.sql loss_noise), measured on the judged steps.
with th as (
    select
        run_id,
        max(value) filter (where name = 'drop_fraction_max') as abs_max,
        max(value) filter (where name = 'drop_fraction_sigma') as k,
        max(value) filter (where name = 'drop_fraction_min_rise') as min_rise,
        max(value) filter (where name = 'drop_fraction_settle_warmups') as settle
    from run_thresholds
    group by run_id
), judged_steps as (
    -- the relative form judges from the settle point on; the absolute one, every step
    select
        d.run_id, d.attempt, d.step, d.drop_fraction, d.dropped, d.assignments,
        d.step > t.settle * coalesce(p.warmup_steps, 0) as settled
    from drops d
    join th t using (run_id)
    left join run_plan p using (run_id)
    where d.drop_fraction is not null
), history as (
    select
        *,
        median(drop_fraction) filter (where settled) over before as running_median,
        count(*) filter (where settled) over before as n_before,
        drop_fraction - lag(drop_fraction) over (partition by run_id, attempt order by step) as change
    from judged_steps
    window before as (partition by run_id, attempt order by step rows between unbounded preceding and 1 preceding)
), noise as (
    select run_id, 1.4826 * median(abs(change - mid)) / sqrt(2) as sigma
    from (select run_id, change, median(change) over (partition by run_id) as mid
          from history where settled and change is not null)
    group by run_id
), judged as (
    select
        h.*, n.sigma,
        case when t.abs_max >= 0 then h.drop_fraction > t.abs_max
             else t.k >= 0 and h.settled and h.n_before >= 5
                  and h.drop_fraction - h.running_median > greatest(t.min_rise, t.k * coalesce(n.sigma, 0)) end as over
    from history h
    join th t using (run_id)
    left join noise n using (run_id)
), observed as (
    select
        run_id, count(*) as n, max(drop_fraction) as worst,
        max(drop_fraction - running_median) filter (where settled and n_before >= 5) as worst_rise,
        any_value(sigma) as sigma,
        count(*) filter (over) as steps_over, min(step) filter (over) as first_step,
        sum(dropped) as dropped, sum(assignments) as assignments
    from judged
    group by run_id
)
select
    r.run_id,
    'drop_fraction' as "check",
    case when o.n is null then 'skip' when o.steps_over > 0 then 'fail' else 'ok' end as status,
    case when t.abs_max >= 0 then o.worst else o.worst_rise end as value,
    case when t.abs_max >= 0 then t.abs_max else t.k end as threshold,
    o.first_step as at_step,
    case when o.n is null then json_object('reason', 'no drops events')
         else json_object('steps_over', o.steps_over, 'drop_events', o.n, 'worst', o.worst,
                          'highest_rise_over_running_median', o.worst_rise, 'noise_sigma', o.sigma,
                          'overall_fraction', o.dropped / nullif(o.assignments, 0),
                          'measure', case when t.abs_max >= 0 then 'a step''s drop fraction against drop_fraction_max'
                                          else 'a step''s drop fraction over the median of the attempt''s settled steps before it' end) end::varchar as evidence
from audit_runs r
join th t using (run_id)
left join observed o using (run_id)
