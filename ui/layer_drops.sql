-- Token drops per MoE layer at the trained length (not the probes), one row per (attempt, step,
-- layer), from each drops event's `layers`; a run whose events carry no layers has its total as layer
-- -1; t: its time (seconds since the epoch). $run: the run id.
select d.attempt, d.step, l.layer, l.drop_fraction, d.stream_seq, epoch(d.ts) as t
from drops d, unnest(from_json(d.layers, '[{"layer":"BIGINT","drop_fraction":"DOUBLE"}]')) as t(l)
where d.run_id = $run and d.step is not null
union all
select attempt, step, -1 as layer, drop_fraction, stream_seq, epoch(ts) as t
from drops
where run_id = $run and step is not null and coalesce(len(from_json(layers, '["JSON"]')), 0) = 0
