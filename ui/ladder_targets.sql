-- The runs ladder $l forecasts for: the target its rungs name, a run of the ladder that has forecasts,
-- and any run whose forecasts were fitted on the ladder's rungs.
with ladder as (select distinct run_id, ladder ->> 'target' as target from runs where ladder ->> 'name' = $l)
select distinct target as t from ladder where target is not null
union
select distinct f.target_run from forecasts f
where f.target_run in (select run_id from ladder)
   or exists (select 1 from ladder r where list_contains(from_json(f.rungs, '["VARCHAR"]'), r.run_id))
order by 1
