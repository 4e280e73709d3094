-- Does a resumed attempt match its past: for the steps attempt k redoes with its config and its decisions unchanged, is its loss within resume_loss_abs_max (0.002) of attempt k-1's, and within resume_loss_rel_max (1%) after warmup (Marin's protocol, by hand there)?
with th as (
    select
        run_id,
        max(value) filter (where name = 'resume_loss_abs_max') as abs_max,
        max(value) filter (where name = 'resume_loss_rel_max') as rel_max
    from run_thresholds
    group by run_id
), starts as (
    select run_id, producer, attempt, arg_min(config_hash, ts) as config_hash from runs group by all
), pairs as (
    -- each attempt and the one before it of the same producer, with the config unchanged (a rewind that
    -- changes the config on purpose is a fork, judged by the provenance audits)
    select a.run_id, a.producer, a.attempt, b.attempt as before
    from starts a
    join starts b on b.run_id = a.run_id and b.producer = a.producer and b.attempt = a.attempt - 1
    where a.config_hash is not distinct from b.config_hash
), changed as (
    -- where the two attempts first applied their decisions differently, at a step both ran: attempt k applied one
    -- attempt k-1 did not at that step (a capacity factor raised on resume, say), or k-1 applied one that k did
    -- not apply at that step (the same decision, read at another step). The run is changed on purpose from the
    -- update after it, so only steps up to it are compared
    select run_id, producer, attempt, min(step) as from_step
    from (
        select p.run_id, p.producer, p.attempt, d.step
        from pairs p
        join decisions_applied d on d.run_id = p.run_id and d.producer = p.producer and d.attempt = p.attempt
        where not exists (select 1 from decisions_applied o
                          where o.run_id = p.run_id and o.producer = p.producer and o.attempt = p.before
                            and o.step = d.step and o.action = d.action)
        union all
        select p.run_id, p.producer, p.attempt, o.step
        from pairs p
        join decisions_applied o on o.run_id = p.run_id and o.producer = p.producer and o.attempt = p.before
        where o.step >= (select min(s.step) from steps_all s
                         where s.run_id = p.run_id and s.producer = p.producer and s.attempt = p.attempt)
          and not exists (select 1 from decisions_applied d
                          where d.run_id = p.run_id and d.producer = p.producer and d.attempt = p.attempt
                            and d.step = o.step and d.action = o.action)
    )
    group by all
), compared as (
    select
        p.run_id, p.attempt, n.step, n.loss, o.loss as loss_before, abs(n.loss - o.loss) as diff,
        n.step > coalesce(pl.warmup_steps, 0) as after_warmup
    from pairs p
    join steps_all n on n.run_id = p.run_id and n.producer = p.producer and n.attempt = p.attempt
    join steps_all o on o.run_id = p.run_id and o.producer = p.producer and o.attempt = p.before and o.step = n.step
    left join run_plan pl on pl.run_id = p.run_id
    left join changed c on c.run_id = p.run_id and c.producer = p.producer and c.attempt = p.attempt
    where n.loss is not null and o.loss is not null and (c.from_step is null or n.step <= c.from_step)
), summary as (
    select
        c.run_id, count(*) as redone, max(c.diff) as worst,
        count(*) filter (where c.diff > t.abs_max or (c.after_warmup and c.diff > t.rel_max * abs(c.loss_before))) as steps_off,
        min(c.step) filter (where c.diff > t.abs_max or (c.after_warmup and c.diff > t.rel_max * abs(c.loss_before))) as first_step
    from compared c
    join th t using (run_id)
    group by c.run_id
)
select
    r.run_id,
    'resume_matches' as "check",
    case when s.redone is null then 'skip' when s.steps_off > 0 then 'fail' else 'ok' end as status,
    s.worst as value,
    t.abs_max as threshold,
    s.first_step as at_step,
    case when s.redone is null then json_object('reason', 'no resumed attempt redoes a step of the one before with the same config and decisions')
         else json_object('steps_redone', s.redone, 'steps_off', s.steps_off,
                          'measure', '|loss - the attempt before''s loss at the same step|') end::varchar as evidence
from audit_runs r
join th t using (run_id)
left join summary s using (run_id)
