-- Did the loss spike: a step above the median of the steps before it at its sequence length by more than loss_spike_sigma x the loss noise at that length (default), or the recent 5-min floor above the last hour's mean + max(0.05, 6 sigma) (Marin)?
with th as (
    select
        run_id,
        max(value) filter (where name = 'loss_spike_sigma') as k,
        max(value) filter (where name = 'loss_spike_baseline_steps') as baseline_n,
        max(value) filter (where name = 'loss_spike_marin_sigma') as marin_k,
        max(value) filter (where name = 'loss_spike_min_rise') as min_rise,
        max(value) filter (where name = 'loss_spike_recent_s') as recent_s,
        max(value) filter (where name = 'loss_spike_baseline_s') as baseline_s,
        max(value) filter (where name = 'loss_spike_recent_min') as recent_min
    from run_thresholds
    group by run_id
), losses as (
    select run_id, producer, attempt, step, seq_len, epoch(ts) as t, loss from steps_all where loss is not null
), relative as (
    -- default: each step against the median of the baseline_n steps before it in its attempt at its sequence
    -- length, in units of the noise at that length (a context extension's new level and noise are not a spike)
    select
        l.run_id, l.step, l.loss,
        (l.loss - median(l.loss) over w) / nullif(n.sigma, 0) as z,
        count(*) over w as history
    from losses l
    join th using (run_id)
    left join loss_noise_by_len n on n.run_id = l.run_id and n.seq_len is not distinct from l.seq_len
    where th.k >= 0
    window w as (partition by l.run_id, l.producer, l.attempt, l.seq_len order by l.step
                 rows between th.baseline_n::bigint preceding and 1 preceding)
), relative_over as (
    select r.run_id, r.step, r.z, r.history >= t.baseline_n and r.z > t.k as over
    from relative r
    join th t using (run_id)
), timed as (
    -- Marin: at each step, the recent window (t - recent_s, t] and the baseline (t - baseline_s, t - recent_s]
    select
        l.run_id, l.step, l.t,
        min(l.loss) over recent as recent_floor, count(*) over recent as recent_n,
        avg(l.loss) over base as base_mean, stddev_samp(l.loss) over base as base_sd, count(*) over base as base_n,
        th.marin_k, th.min_rise, th.baseline_n, th.recent_min
    from losses l
    join th using (run_id)
    where th.marin_k >= 0
    window
        recent as (partition by l.run_id order by l.t range between th.recent_s preceding and current row),
        base as (partition by l.run_id order by l.t range between th.baseline_s preceding and th.recent_s preceding)
), marin_over as (
    select
        run_id, step, (recent_floor - base_mean) / nullif(base_sd, 0) as z,
        base_n >= baseline_n and recent_n >= recent_min
            and recent_floor > base_mean + greatest(min_rise, marin_k * coalesce(base_sd, 0)) as over
    from timed
), judged as (
    select run_id, step, z, over from relative_over
    union all
    select run_id, step, z, over from marin_over
), summary as (
    select run_id, count(*) as n, max(z) as worst, count(*) filter (where over) as steps_over,
           min(step) filter (where over) as first_step
    from judged
    group by run_id
), seen as (
    select run_id, count(*) as n from losses group by run_id
)
select
    r.run_id,
    'loss_spike' as "check",
    case when coalesce(e.n, 0) = 0 then 'skip' when s.steps_over > 0 then 'fail' else 'ok' end as status,
    s.worst as value,
    case when t.marin_k >= 0 then t.marin_k else t.k end as threshold,
    s.first_step as at_step,
    json_merge_patch(case when coalesce(e.n, 0) = 0 then json_object('reason', 'no step reports a loss')
         else json_object('steps_over', coalesce(s.steps_over, 0), 'loss_noise_sigma', n.sigma,
                          'measure', case when t.marin_k >= 0
                                          then '(recent floor - baseline mean) / baseline sigma; over: floor > mean + max(loss_spike_min_rise, loss_spike_marin_sigma x sigma)'
                                          else '(loss - median of the loss_spike_baseline_steps before it at its sequence length) / the loss noise sigma at that length' end) end,
                     json_object('loss_unit', u.note))::varchar as evidence
from audit_runs r
join th t using (run_id)
left join seen e using (run_id)
left join summary s using (run_id)
left join loss_noise n using (run_id)
left join run_loss_unit u using (run_id)
