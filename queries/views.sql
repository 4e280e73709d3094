-- The ledger's SQL views (DESIGN.md, SQL views). `{{kind:NAME}}` is replaced by the loader with a scan
-- of that kind's Parquet files (or an empty relation of the same columns when there are none yet);
-- `{{quarantine}}` likewise. Every view is derived from the stored events; nothing here writes.

-- every event of every kind: the envelope columns and the canonical payload text
create or replace view events as
{{all_kinds}};

-- one row per (run, producer attempt) that started: config, budget, schedule, thresholds
create or replace view runs as
select * from {{kind:run_started}};

-- every step of every attempt (a resumed run re-does the steps after its checkpoint)
create or replace view steps_all as
select * from {{kind:step}};

-- one row per (run_id, step): the latest attempt's
create or replace view steps as
select * from steps_all
qualify row_number() over (partition by run_id, step order by attempt desc, seq desc) = 1;

create or replace view drops as
select * from {{kind:drops}};

create or replace view evals as
select * from {{kind:eval}};

create or replace view checkpoints as
select * from {{kind:checkpoint}};

create or replace view data as
select * from {{kind:data}};

create or replace view forecasts as
select * from {{kind:forecast}};

create or replace view alerts as
select * from {{kind:alert}};

create or replace view decisions as
select * from {{kind:decision}};

create or replace view decisions_applied as
select * from {{kind:decision_applied}};

create or replace view runs_finished as
select * from {{kind:run_finished}};

-- input the ledger refused, with the raw bytes, the subject and the reason
create or replace view quarantine as
select * from {{quarantine}};
