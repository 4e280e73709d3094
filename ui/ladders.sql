-- Every scaling ladder: its name, its rungs and the run each forecasts for.
select
    ladder ->> 'name' as ladder,
    count(distinct run_id) filter (ladder ->> 'target' is null or ladder ->> 'target' <> run_id) as rungs,
    list(distinct ladder ->> 'target') filter (ladder ->> 'target' is not null) as targets
from runs
where ladder is not null
group by all
order by ladder
