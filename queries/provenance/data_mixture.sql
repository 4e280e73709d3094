-- Was the data mixture realised as declared: per domain, run_started's mixture against the data event's tokens per domain?
with declared as (
    -- the mixture each run declared when it first started
    select r.run_id, d.key as domain, d.value::double as declared_share
    from (select * from runs qualify row_number() over (partition by run_id order by attempt, ts, seq) = 1) r,
         json_each(r.data_mixture) d
), recorded as (
    -- the latest data event of each run: its mixture and the tokens it drew per domain
    select * from data
    qualify row_number() over (partition by run_id order by attempt desc, ts desc, seq desc) = 1
), realised as (
    select
        x.run_id, x.attempt, x.step, t.key as domain, t.value::bigint as tokens,
        (x.mixture ->> t.key)::double as recorded_share
    from recorded x, json_each(x.tokens_per_domain) t
), shares as (
    select *, tokens / sum(tokens) over (partition by run_id) as token_share from realised
)
select
    coalesce(d.run_id, s.run_id) as run_id,
    coalesce(d.domain, s.domain) as domain,
    d.declared_share,
    s.recorded_share,
    s.tokens,
    s.token_share,
    s.token_share - d.declared_share as share_minus_declared,
    s.attempt as data_attempt,
    s.step as data_step
from declared d
full join shares s on s.run_id = d.run_id and s.domain = d.domain
order by run_id, domain
