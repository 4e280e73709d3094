-- Which checkpoint did each attempt resume (or fork, or rewind) from, and does the ledger hold that checkpoint with that content hash?
with starts as (
    select
        run_id, producer, attempt, ts, step,
        case when parent is not null then 'fork' when rewind is not null then 'rewind'
             when resumed_from is not null then 'resume' else 'fresh' end as start_kind,
        coalesce(parent ->> 'run_id', run_id) as source_run,
        coalesce(resumed_from ->> 'path', parent ->> 'path', parent ->> 'checkpoint', rewind ->> 'path') as from_path,
        coalesce((resumed_from ->> 'step')::bigint, (parent ->> 'step')::bigint, (rewind ->> 'step')::bigint) as from_step,
        coalesce(resumed_from ->> 'content_hash', parent ->> 'content_hash', parent ->> 'checkpoint_content_hash',
                 rewind ->> 'content_hash') as from_hash
    from runs
), matched as (
    -- the saved checkpoint with that content hash (else that path) in the source run
    select
        s.*, c.run_id as ckpt_run, c.attempt as ckpt_attempt, c.step as ckpt_step, c.path as ckpt_path,
        c.content_hash as ckpt_hash, c.config_hash as ckpt_config_hash, c.reason as ckpt_reason
    from starts s
    left join checkpoints c
        on c.run_id = s.source_run
       and (c.content_hash = s.from_hash or (s.from_hash is null and c.path = s.from_path))
    qualify row_number() over (partition by s.run_id, s.producer, s.attempt, s.ts order by c.ts desc nulls last) = 1
)
select
    run_id, producer, attempt, ts as started_at, start_kind, source_run, from_path, from_step, from_hash,
    ckpt_attempt as saved_by_attempt, ckpt_step as saved_at_step, ckpt_reason as saved_reason,
    case when start_kind = 'fresh' then 'fresh start'
         when from_path is null and from_hash is null then 'no checkpoint named (the history only)'
         when ckpt_run is null then 'checkpoint not in the ledger'
         -- (a fork or a rewind at step N names the newest checkpoint at or before N: runledger.queries.forks)
         when from_step is not null and (ckpt_step > from_step or (start_kind = 'resume' and ckpt_step <> from_step))
             then 'step differs from the saved checkpoint'
         else 'matches a saved checkpoint' end as lineage
from matched
order by run_id, producer, attempt, started_at
