-- Stall evidence for one run ($run_id): when its last step was (by the producers' clock, as the
-- telemetry evidence reads it) and how long ago, the median gap between its recent steps, and the
-- stall alert (agents/stall.py's) still open, if any, with the steps the ledger took after it.
with recent as (
    -- the last 101 steps (100 gaps): an eval or a checkpoint save among them does not move the median
    select ts, step_time_s from steps_all where run_id = $run_id order by ts desc limit 101
), gaps as (
    select epoch(ts) - epoch(lag(ts) over (order by ts)) as gap_s from recent
), stalls as (
    select alert_id, state, stream_seq from alerts
    where run_id = $run_id and rule = 'stalled' and agent = 'agent-stall'
), still_open as (
    select alert_id, max(stream_seq) as opened_seq from stalls where state = 'open'
      and alert_id not in (select alert_id from stalls where state = 'resolved')
    group by alert_id order by opened_seq desc limit 1
)
select (select count(*) from steps_all where run_id = $run_id) as steps,
       (select max(ts) from recent) as last_step_ts,
       epoch(now()) - epoch((select max(ts) from recent)) as silent_s,
       (select median(gap_s) from gaps where gap_s is not null) as median_gap_s,
       (select median(step_time_s) from recent) as median_step_time_s,
       o.alert_id as open_alert_id,
       (select count(*) from steps_all s where s.run_id = $run_id and s.stream_seq > o.opened_seq) as steps_after_alert
from (select 1) left join still_open o on true
