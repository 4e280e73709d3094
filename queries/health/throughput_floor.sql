-- Was throughput below its floor for most of a window: more than throughput_below_share of at least throughput_min_samples samples in throughput_window_s (Marin: half of >= 10 in 15 min) under the floor, throughput_floor_ratio x the run's median (default) or throughput_plan_floor x the plan (Marin)?
--
-- A sample is a step's MFU (else its tokens/s); each attempt's first step (compilation) is left out of
-- the median but counted as a sample, so one restart step cannot trip the check; the first
-- throughput_skip_steps of each attempt (compilation, caches warming) are not judged. The default floor is
-- throughput_floor_ratio x the median of the samples before the window (at least throughput_min_samples
-- of them; else of those a window after it; else of the whole run), so that a long dip does not lower
-- its own floor. By default a sample is the median of throughput_smooth_samples consecutive steps' rates
-- centred on it (Marin's profile: 1, the step's own): a step's rate on a shared machine jitters 25-40%,
-- and a median of 5 tells a step of a dip at half the rate from a healthy one 99 times in 100, where
-- one step's rate does 9 in 10; one slow step cannot move a median of 5.
--
-- Cost: every frame below is a running one or a few rows (one sort each) and each window is found by an ASOF lookup on
-- time, so the check costs O(n log n) however many samples a window holds; range-framed medians and
-- filtered counts over the window cost O(n x window), minutes for a run of 1M steps stamped within 15 min.
with th as (
    select
        run_id,
        max(value) filter (where name = 'throughput_floor_ratio') as ratio,
        max(value) filter (where name = 'throughput_plan_floor') as plan_floor,
        max(value) filter (where name = 'throughput_window_s') as window_s,
        max(value) filter (where name = 'throughput_min_samples') as min_samples,
        max(value) filter (where name = 'throughput_below_share') as share,
        max(value) filter (where name = 'throughput_skip_steps') as skip_steps,
        max(value) filter (where name = 'throughput_smooth_samples') as smooth
    from run_thresholds
    group by run_id
), measure as (
    select run_id, count(mfu) > 0 as by_mfu from steps_all group by run_id
), samples as (
    select
        s.run_id, s.attempt, s.step, epoch(s.ts) as t,
        case when m.by_mfu then s.mfu else s.tokens_per_s end as x,
        median(case when m.by_mfu then s.mfu else s.tokens_per_s end) over (
            partition by s.run_id, s.producer, s.attempt order by s.step
            rows between (greatest(t.smooth, 1)::bigint - 1) // 2 preceding and (greatest(t.smooth, 1)::bigint - 1) // 2 following) as xs,
        s.step = min(s.step) over (partition by s.run_id, s.producer, s.attempt) as first_of_attempt,
        row_number() over (partition by s.run_id, s.producer, s.attempt order by s.step) as nth
    from steps_all s
    join measure m using (run_id)
    join th t using (run_id)
    where case when m.by_mfu then s.mfu else s.tokens_per_s end is not null
), floors as (
    select
        x.run_id,
        case when t.plan_floor >= 0 then t.plan_floor * case when m.by_mfu then p.planned_mfu else p.planned_tokens_per_s end
             when t.ratio >= 0 then t.ratio * median(x.x) filter (where not x.first_of_attempt) end as floor,
        any_value(case when m.by_mfu then 'mfu' else 'tokens_per_s' end) as measure,
        median(x.x) filter (where not x.first_of_attempt) as run_median
    from samples x
    join th t using (run_id)
    join measure m using (run_id)
    left join run_plan p using (run_id)
    group by x.run_id, t.plan_floor, t.ratio, m.by_mfu, p.planned_mfu, p.planned_tokens_per_s
), judged as (
    -- the samples judged, each with the run's floor (compilation and cache-warming steps left out)
    select x.*, f.floor as run_floor, t.window_s
    from samples x
    join floors f using (run_id)
    join th t using (run_id)
    where f.floor is not null and x.nth > t.skip_steps
), reference as (
    -- the judged samples that may set a floor (each attempt's first step left out), each with the count and
    -- median of those up to its time and of those from its time on: a running median in one sort each, where
    -- a median over a window frame with a filter is recomputed row by row (O(n x frame): minutes at 1M)
    select
        run_id, t,
        count(*) over up as n_up, median(x) over up as median_up,
        count(*) over down as n_down, median(x) over down as median_down
    from judged
    where not first_of_attempt
    window up as (partition by run_id order by t), down as (partition by run_id order by t desc)
), referenced as (
    -- each sample's floor: the plan's (Marin), else the ratio x the median of the samples before its window
    -- (the running median at the last time <= t - window_s), else of those after it (the first time >= t + window_s)
    select
        x.*,
        case when t.plan_floor < 0 and coalesce(b.n_up, 0) >= t.min_samples then t.ratio * b.median_up end as before_floor,
        case when t.plan_floor < 0 and coalesce(a.n_down, 0) >= t.min_samples then t.ratio * a.median_down end as after_floor
    from judged x
    join th t using (run_id)
    asof left join reference b on x.run_id = b.run_id and x.t - x.window_s >= b.t
    asof left join reference a on x.run_id = a.run_id and x.t + x.window_s <= a.t
), running as (
    -- how many samples, and how many under their floor, up to each time: a window's counts are two of these
    -- apart (a count over a frame of every sample within window_s is recounted row by row: minutes at 1M)
    select
        run_id, step, t, window_s,
        count(*) over up as n_up,
        count(case when xs < coalesce(before_floor, after_floor, run_floor) then 1 end) over up as below_up
    from referenced
    window up as (partition by run_id order by t)
), windows as (
    -- each sample's window [t - window_s, t]: the running counts at t less those at the last time before t - window_s
    select x.run_id, x.step, x.n_up - coalesce(b.n_up, 0) as n, x.below_up - coalesce(b.below_up, 0) as below
    from running x
    asof left join running b on x.run_id = b.run_id and x.t - x.window_s > b.t
), summary as (
    select
        w.run_id, count(*) as windows, max(w.below / w.n) filter (where w.n >= t.min_samples) as worst,
        count(*) filter (where w.n >= t.min_samples and w.below > t.share * w.n) as windows_over,
        min(w.step) filter (where w.n >= t.min_samples and w.below > t.share * w.n) as first_step
    from windows w
    join th t using (run_id)
    group by w.run_id
)
select
    r.run_id,
    'throughput_floor' as "check",
    case when f.floor is null or s.worst is null then 'skip' when s.windows_over > 0 then 'fail' else 'ok' end as status,
    s.worst as value,
    t.share as threshold,
    s.first_step as at_step,
    case when f.run_id is null then json_object('reason', 'no step reports mfu or tokens_per_s')
         when f.floor is null then json_object('reason', 'no floor: no plan (run_started.planned_tokens_per_s or config.planned_mfu) for the profile''s plan floor')
         when s.worst is null then json_object('reason', 'no window holds throughput_min_samples samples')
         else json_object('floor', f.floor, 'run_median', f.run_median, 'windows_over', s.windows_over,
                          'measure', 'share of a window''s ' || f.measure || ' samples below the floor') end::varchar as evidence
from audit_runs r
join th t using (run_id)
left join floors f using (run_id)
left join summary s using (run_id)
