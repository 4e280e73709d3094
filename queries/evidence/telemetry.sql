-- Telemetry evidence for one run ($run_id): when it was last heard from, and whether it finished.
select max(ts) as last_ts, epoch(now()) - epoch(max(ts)) as silent_s,
       (select count(*) from runs_finished where run_id = $run_id) as finished
from events where run_id = $run_id
