-- Is the config accurate: does each run_started's config hash to its config_hash, and does every checkpoint carry that hash?
with starts as (
    select run_id, attempt, ts, seq, step, config_hash, sha256(config) as computed_hash
    from runs
), start_check as (
    select
        run_id, count(*) as starts,
        count(*) filter (config_hash <> computed_hash) as starts_off,
        min(step) filter (config_hash <> computed_hash) as first_step
    from starts
    group by run_id
), ckpt_check as (
    -- a checkpoint is held to the run_started of its attempt (else the latest of an earlier attempt)
    select
        c.run_id, c.step, c.path, c.config_hash as ckpt_hash, s.config_hash as started_hash,
        c.config_hash is distinct from s.config_hash as off
    from checkpoints c
    asof left join starts s on s.run_id = c.run_id and c.attempt >= s.attempt
), ckpt_summary as (
    select
        run_id, count(*) as checkpoints, count(*) filter (off) as checkpoints_off,
        min(step) filter (off) as first_step,
        arg_min(path, step) filter (off) as first_path
    from ckpt_check
    group by run_id
)
select
    r.run_id,
    'config_match' as "check",
    case when s.starts is null then 'skip'
         when s.starts_off > 0 or coalesce(c.checkpoints_off, 0) > 0 then 'fail' else 'ok' end as status,
    (coalesce(s.starts_off, 0) + coalesce(c.checkpoints_off, 0))::double as value,
    0.0 as threshold,
    least(s.first_step, c.first_step) as at_step,
    case when s.starts is null then json_object('reason', 'no run_started')
         else json_object('run_started', s.starts, 'config_hash_mismatch', s.starts_off,
                          'checkpoints', coalesce(c.checkpoints, 0), 'checkpoints_off', coalesce(c.checkpoints_off, 0),
                          'first_checkpoint_off', c.first_path,
                          'rule', 'sha256(run_started.config) = config_hash = checkpoint.config_hash') end::varchar as evidence
from audit_runs r
left join start_check s using (run_id)
left join ckpt_summary c using (run_id)
