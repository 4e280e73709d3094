-- Skipped-step evidence for one run ($run_id): skipped steps in the trailing time window, and the
-- last checkpoint before them (where a rollback would go).
with last_step as (
    select max(ts) as now from steps where run_id = $run_id
), skipped as (
    select s.step, s.ts from steps s, last_step l
    where s.run_id = $run_id and s.skipped and s.ts >= l.now - to_seconds($window_s)
)
select (select count(*) from skipped) as skipped, (select min(step) from skipped) as first_skipped,
       (select max(step) from skipped) as last_skipped,
       (select max(step) from checkpoints c where c.run_id = $run_id
          and c.step < coalesce((select min(step) from skipped), 9223372036854775807)) as checkpoint_step
