-- Which code and config did each attempt run: the commit, config hash and preset per (run, producer, attempt), and what changed?
with starts as (
    select
        run_id, producer, attempt, ts, step, code_commit, config_hash, preset,
        resumed_from ->> 'path' as resumed_from_path,
        parent ->> 'run_id' as parent_run
    from runs
), compared as (
    select
        *,
        lag(code_commit) over w as previous_commit,
        lag(config_hash) over w as previous_config_hash
    from starts
    window w as (partition by run_id, producer order by attempt, ts)
)
select
    run_id, producer, attempt, ts as started_at, step as started_at_step, code_commit, config_hash, preset,
    previous_commit is not null and code_commit is distinct from previous_commit as commit_changed,
    previous_config_hash is not null and config_hash is distinct from previous_config_hash as config_changed,
    resumed_from_path, parent_run
from compared
order by run_id, producer, attempt, started_at
