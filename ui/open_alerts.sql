-- A run's open alerts for its page, the latest first: who raised each, how bad, what it said, and the
-- latest acknowledgement of it (`alert_ack`: who took the page, when), if any. $run: the run id.
with acked as (
    select alert_id, arg_max("by", stream_seq) as acked_by, max(time) as acked_at
    from alert_acks
    where run_id = $run
    group by alert_id
)
select a.alert_id, a.agent, a.rule, a.severity, a.message, a.step, a.time as raised_at, k.acked_by, k.acked_at
from open_alerts a
left join acked k using (alert_id)
where a.run_id = $run
order by a.stream_seq desc, a.seq desc
limit 200
