-- A run's attempts, as they started (one row per run_started): who, when, resumed (forked, rewound) from what, the
-- declared plan; the first one's config is the run's. $run: the run id.
select
    attempt, producer, time, step, project, preset, tags, config, config_hash, code_commit, token_budget,
    tokens_per_step, schedule, planned_tokens_per_s, peak_flops, flops_per_token, resumed_from, parent, rewind, ladder,
    stream_seq
from runs
where run_id = $run
order by attempt, ts, seq
