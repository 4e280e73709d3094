-- Where did the tokens come from: every data source each attempt recorded, with its sha256 and byte range?
with sources as (
    select
        run_id, producer, attempt, step, ts, seed,
        unnest(from_json(sources, '[{"domain":"VARCHAR","path":"VARCHAR","sha256":"VARCHAR","byte_start":"BIGINT","byte_end":"BIGINT"}]'),
               recursive := true)
    from data
)
select
    run_id, attempt, producer, step, domain, path, sha256, byte_start, byte_end,
    byte_end - byte_start as bytes, seed, ts as recorded_at
from sources
order by run_id, attempt, domain, path
