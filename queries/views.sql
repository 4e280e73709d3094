-- The ledger's SQL views (DESIGN.md, SQL views). `{{kind:NAME}}` is replaced by the loader with a scan
-- of that kind's Parquet files (or an empty relation of the same columns when there are none yet);
-- `{{quarantine}}` likewise. Every view is derived from the stored events; nothing here writes.

-- every event of every kind: the envelope columns and the canonical payload text
create or replace view events as
{{all_kinds}};

-- one row per (run, producer attempt) that started: config, budget, schedule, thresholds; `name` the
-- run's display name (not unique: run_id is the id), else the name another attempt of the run gave,
-- else run_id (a run started before names were kept); W&B's "group", job_type and notes; and its `state`
-- (the contract's RUN_STATES): finished (run_finished completed), failed (failed or stopped), crashed (no
-- run_finished, and its last heartbeat, or its start, older than HEARTBEAT_MISSED = 2.5 of its heartbeat
-- interval: the process is gone), else running (a run that sends no heartbeat reads running until it finishes);
-- `config_final` the run's config with every `config.update` applied (the same on each of its rows): each
-- start's config and each config_updates row in time order (a start before an update at the same time), each
-- top-level key at its latest value (`config` stays the start's as declared: config_hash is its hash)
create or replace view runs as
select r.* replace (coalesce(r.name, min(r.name) over (partition by r.run_id), r.run_id) as name),
       case when f.status = 'completed' then 'finished'
            when f.status is not null then 'failed'
            when coalesce(h.interval_s, r.heartbeat_s) is not null
                 and greatest(r.ts, h.last_beat) < now() - to_microseconds(cast(2.5e6 * coalesce(h.interval_s, r.heartbeat_s) as bigint))
                then 'crashed'
            else 'running' end as state,
       c.config_final
from {{kind:run_started}} r  -- (r.name: the macro metric(name) below binds through this view)
left join (select run_id, producer, attempt, arg_max(status, seq) as status from {{kind:run_finished}} group by all) f
    using (run_id, producer, attempt)
left join (select run_id, producer, attempt, max(ts) as last_beat, arg_max(interval_s, seq) as interval_s
           from {{kind:heartbeat}} group by all) h
    using (run_id, producer, attempt)
left join (select run_id, to_json(list_reduce(list(config order by ts, late, attempt, seq) filter (config is not null),
                                              lambda a, b: map_concat(a, b), map()::map(varchar, json))) as config_final
           from (select run_id, ts, false as late, attempt, seq,
                        case when json_type(config) = 'OBJECT' then config::json::map(varchar, json) end as config
                 from {{kind:run_started}}
                 union all
                 select run_id, ts, true, attempt, seq,
                        case when json_type(config) = 'OBJECT' then config::json::map(varchar, json) end
                 from {{kind:config}})
           group by run_id) c
    using (run_id);

-- one row per run: its id, its name (its first attempt's), project and start: what a name is looked up in
create or replace view run_names as
select r.run_id, coalesce(arg_min(r.name, r.ts) filter (r.name is not null), r.run_id) as name,
       arg_min(r.project, r.ts) as project, min(r.ts) as started_at
from runs r
group by r.run_id;

-- the run `run` names: the run of that id, else the one run of that name, else `run` itself (no such
-- run: the query finds none); a name that several runs have is an error listing them (id, project,
-- start). `runledger.queries.names.resolve_run` asks this for every command that takes a RUN.
create or replace macro run_of(run) as (
    select case
        when count(*) filter (run_id = run) > 0 or count(*) = 0 then run
        when count(*) = 1 then any_value(run_id)
        else error('run name ' || to_json(run)::varchar || ' is ambiguous: ' || count(*) || ' runs have it: '
                   || string_agg(run_id || ' (project ' || coalesce(project, 'none') || ', started '
                                 || strftime(started_at, '%Y-%m-%d %H:%M:%S') || ')', ', ' order by started_at, run_id)
                   || ' (give one''s id)') end
    from run_names
    where run_id = run or name = run);

-- the `chain_head` events: each producer's signature over its chain so far (runledger.ledger.tlog.chainheads)
create or replace view chain_heads as
select * from {{kind:chain_head}};

-- the `heartbeat` events of live processes (runledger.init's run, the trainer's worker)
create or replace view heartbeats as
select * from {{kind:heartbeat}};

-- the typed `step` events of runledger's own trainer, as stored
create or replace view step_events as
select * from {{kind:step}};

-- the metric name a stored "metrics/NAME" column holds (NAME after its 9th character): NAME with each %xx
-- decoded (every byte of the name's UTF-8 outside [a-z0-9_./-] is escaped, so that `Loss` and `loss`
-- are two columns: `runledger.ledger.contract.columns.metric_column`); a column of a root written before names were
-- escaped, which holds the name as logged, is read as it is unless it reads as escaped
create or replace macro metric_key(escaped) as
case when contains(escaped, '%') and regexp_full_match(escaped, '([a-z0-9_./-]|%[0-9a-f]{2})+')
     then coalesce(try(url_decode(escaped)), escaped) else escaped end;

-- every `metrics` event (`runledger.log`), as stored: one DOUBLE column per name logged, "metrics/NAME"
-- with NAME escaped (read it with `metric_key`), null where the event has no such name, or its value
-- was not finite (then `nonfinite` names it); the names past the table's bound on columns
-- (`runledger.ledger.contract.columns.WIDE_COLUMNS_MAX`) in the MAP column "metrics/" (name -> value) instead
create or replace view metric_events as
select * from {{kind:metrics}};

-- the same, with a column for each name the health checks read (below), even where no run logged it
create or replace view metrics_wide as
select * from metric_events
union all by name
select null::double as "metrics/loss", null::double as "metrics/train/loss", null::double as "metrics/grad_norm",
       null::double as "metrics/train/grad_norm", null::double as "metrics/optim/grad_norm", null::double as "metrics/lr",
       null::double as "metrics/learning_rate", null::double as "metrics/train/lr", null::double as "metrics/optim/learning_rate",
       null::double as "metrics/tokens", null::double as "metrics/train/tokens", null::double as "metrics/step_time_s",
       null::double as "metrics/train/step_time_s", null::double as "metrics/throughput/duration",
       null::double as "metrics/param_norm", null::double as "metrics/train/param_norm", null::double as "metrics/optim/param_norm",
       null::double as "metrics/router_entropy", null::double as "metrics/train/router_entropy",
       null::double as "metrics/router_bias_min", null::double as "metrics/router_bias_max", null::double as "metrics/mfu",
       null::double as "metrics/train/mfu", null::double as "metrics/throughput/mfu", null::double as "metrics/tokens_per_s",
       null::double as "metrics/throughput/tokens_per_second", null::double as "metrics/eval/loss",
       null::double as "metrics/val/loss", null::double as no_metric, null::map(varchar, double) as "metrics/"
where false;

-- the same, each name the health checks read from its column or, past the bound, from "metrics/"
create or replace view metrics_checked as
select * replace (
    coalesce("metrics/loss", "metrics/"['loss']) as "metrics/loss",
    coalesce("metrics/train/loss", "metrics/"['train/loss']) as "metrics/train/loss",
    coalesce("metrics/grad_norm", "metrics/"['grad_norm']) as "metrics/grad_norm",
    coalesce("metrics/train/grad_norm", "metrics/"['train/grad_norm']) as "metrics/train/grad_norm",
    coalesce("metrics/optim/grad_norm", "metrics/"['optim/grad_norm']) as "metrics/optim/grad_norm",
    coalesce("metrics/lr", "metrics/"['lr']) as "metrics/lr",
    coalesce("metrics/learning_rate", "metrics/"['learning_rate']) as "metrics/learning_rate",
    coalesce("metrics/train/lr", "metrics/"['train/lr']) as "metrics/train/lr",
    coalesce("metrics/optim/learning_rate", "metrics/"['optim/learning_rate']) as "metrics/optim/learning_rate",
    coalesce("metrics/tokens", "metrics/"['tokens']) as "metrics/tokens",
    coalesce("metrics/train/tokens", "metrics/"['train/tokens']) as "metrics/train/tokens",
    coalesce("metrics/step_time_s", "metrics/"['step_time_s']) as "metrics/step_time_s",
    coalesce("metrics/train/step_time_s", "metrics/"['train/step_time_s']) as "metrics/train/step_time_s",
    coalesce("metrics/throughput/duration", "metrics/"['throughput/duration']) as "metrics/throughput/duration",
    coalesce("metrics/param_norm", "metrics/"['param_norm']) as "metrics/param_norm",
    coalesce("metrics/train/param_norm", "metrics/"['train/param_norm']) as "metrics/train/param_norm",
    coalesce("metrics/optim/param_norm", "metrics/"['optim/param_norm']) as "metrics/optim/param_norm",
    coalesce("metrics/router_entropy", "metrics/"['router_entropy']) as "metrics/router_entropy",
    coalesce("metrics/train/router_entropy", "metrics/"['train/router_entropy']) as "metrics/train/router_entropy",
    coalesce("metrics/router_bias_min", "metrics/"['router_bias_min']) as "metrics/router_bias_min",
    coalesce("metrics/router_bias_max", "metrics/"['router_bias_max']) as "metrics/router_bias_max",
    coalesce("metrics/mfu", "metrics/"['mfu']) as "metrics/mfu",
    coalesce("metrics/train/mfu", "metrics/"['train/mfu']) as "metrics/train/mfu",
    coalesce("metrics/throughput/mfu", "metrics/"['throughput/mfu']) as "metrics/throughput/mfu",
    coalesce("metrics/tokens_per_s", "metrics/"['tokens_per_s']) as "metrics/tokens_per_s",
    coalesce("metrics/throughput/tokens_per_second", "metrics/"['throughput/tokens_per_second'])
        as "metrics/throughput/tokens_per_second",
    coalesce("metrics/eval/loss", "metrics/"['eval/loss']) as "metrics/eval/loss",
    coalesce("metrics/val/loss", "metrics/"['val/loss']) as "metrics/val/loss")
from metrics_wide;

-- every step of every attempt (a resumed run re-does the steps after its checkpoint): the typed
-- `step` events, and for a run that has none (a loop logging with `runledger.log`) one row per metrics
-- event holding a loss, read under the names below (the first one logged wins; a value logged by
-- another call at the same step counts too), so the health checks read that run too; a check whose
-- column no name gives says `skip`. A loss that was not finite is a skipped step, as in a typed `step`.
create or replace view steps_all as
select * from step_events
union all by name
select * exclude (has_loss) from (
    select event_id, run_id, producer, attempt, seq, kind, time, ts, step, schema_version, prev_hash, hash, payload,
           stream_seq, ingested_at,
           coalesce("metrics/loss", "metrics/train/loss") as loss,
           coalesce("metrics/loss", "metrics/train/loss") is not null
               or coalesce(nonfinite['loss'], nonfinite['train/loss']) is not null as has_loss,
           coalesce(nonfinite['loss'], nonfinite['train/loss']) is not null as skipped,
           max(coalesce("metrics/grad_norm", "metrics/train/grad_norm", "metrics/optim/grad_norm")) over w as grad_norm,
           max(coalesce("metrics/lr", "metrics/learning_rate", "metrics/train/lr", "metrics/optim/learning_rate")) over w as lr,
           max(cast(coalesce("metrics/tokens", "metrics/train/tokens") as bigint)) over w as tokens,
           max(coalesce("metrics/step_time_s", "metrics/train/step_time_s", "metrics/throughput/duration")) over w as step_time_s,
           max(coalesce("metrics/param_norm", "metrics/train/param_norm", "metrics/optim/param_norm")) over w as param_norm,
           max(coalesce("metrics/router_entropy", "metrics/train/router_entropy")) over w as router_entropy,
           min("metrics/router_bias_min") over w as router_bias_min,
           max("metrics/router_bias_max") over w as router_bias_max,
           max(coalesce("metrics/mfu", "metrics/train/mfu", "metrics/throughput/mfu")) over w as mfu,
           max(coalesce("metrics/tokens_per_s", "metrics/throughput/tokens_per_second")) over w as tokens_per_s
    from metrics_checked
    where run_id not in (select run_id from step_events)
    window w as (partition by run_id, producer, attempt, step))
where has_loss;

-- every attempt that started from a history (runledger.queries.forks): a fork (run_started.parent: another
-- run's history, up to its step `fork_step`) or a rewind (run_started.rewind, `init(resume_from=)`: the run's
-- own, up to `fork_step`; the attempts before it no longer count after it); the parent's attempt and ledger
-- position (`parent_stream_seq`, `parent_event_id`) where the start recorded them. (Read through `runs`, the
-- run_started kind's view, so that a reader scoped to some runs' files reads theirs.)
create or replace view forks as
select run_id, attempt, producer, ts, case when rewind is not null then 'rewind' else 'fork' end as how,
       coalesce(rewind, parent) ->> 'run_id' as parent_run,
       (coalesce(rewind, parent) ->> 'attempt')::bigint as parent_attempt,
       (coalesce(rewind, parent) ->> 'step')::bigint as fork_step,
       (coalesce(rewind, parent) ->> 'stream_seq')::bigint as parent_stream_seq,
       coalesce(rewind, parent) ->> 'event_id' as parent_event_id
from runs
where coalesce(rewind, parent) is not null
qualify row_number() over (partition by run_id, attempt order by seq) = 1;

-- what each run's spliced history reads, for the runs that fork, are forked or are rewound (any other run
-- reads its own rows only, and is not listed): at depth 0 its own rows after its fork step (step_lo; null:
-- all); at depth 1 its parent's, at 2 the parent's parent's, ... (a fork's line of descent), each over
-- (step_lo, step_hi] as they stood at the attempt the fork named (`as_of_attempt`: a later rewind of the
-- parent leaves the fork's history as it was). `cuts`: the source run's rewinds ({attempt, step}: from that
-- attempt on, the attempts before it count only up to that step). A run's first fork start counts (its
-- resumed attempts go on from its own steps). `steps` and `metric_events_latest` join their rows to it by
-- source_run: a ledger without forks pays one join with an empty table, not a second scan.
create or replace view fork_reads as
with recursive started as materialized (  -- (one read of the starts for all below)
    select run_id, attempt, how, parent_run, parent_attempt, fork_step from forks
), first_fork as (
    select run_id, parent_run, coalesce(parent_attempt, 9223372036854775807) as as_of_attempt, fork_step
    from started where how = 'fork' and parent_run <> run_id
    qualify row_number() over (partition by run_id order by attempt) = 1
), line(run_id, source_run, as_of_attempt, step_hi, depth) as (
    select run_id, parent_run, as_of_attempt, fork_step, 1 from first_fork
    union all
    select l.run_id, f.parent_run, f.as_of_attempt, least(l.step_hi, f.fork_step), l.depth + 1
    from line l join first_fork f on f.run_id = l.source_run
    where l.depth < 64 and f.parent_run <> l.run_id
), reads as (
    select l.run_id, l.source_run, l.as_of_attempt, f.fork_step as step_lo, l.step_hi, l.depth
    from line l left join first_fork f on f.run_id = l.source_run
    union all
    select r.run_id, r.run_id, null, f.fork_step, null, 0
    from (select run_id from started union select source_run from line) r
    left join first_fork f using (run_id)
)
select r.*, c.cuts
from reads r
left join (select run_id, list({'attempt': attempt, 'step': fork_step}) as cuts from started where how = 'rewind'
           group by run_id) c on c.run_id = r.source_run;

-- each fork's line of descent (fork_reads at depth 1 and up): the runs whose steps its history reads, each
-- over (step_lo, step_hi] as of `as_of_attempt`
create or replace view fork_lines as
select run_id, source_run, as_of_attempt, step_lo, step_hi, depth from fork_reads where depth > 0;

-- one row per (run_id, step): the latest attempt's, unless a later attempt rewound the run to an earlier
-- step; for a fork, spliced: its parent's rows up to the fork step (through the parent's own parents, see
-- fork_lines) and its own after. `from_run` is the run whose row it is (run_id, or an ancestor's).
create or replace view steps as
select s.* replace (coalesce(f.run_id, s.run_id) as run_id), s.run_id as from_run
from steps_all s
left join fork_reads f on f.source_run = s.run_id
where (f.step_lo is null or s.step > f.step_lo) and (f.step_hi is null or s.step <= f.step_hi)
  and (f.as_of_attempt is null or s.attempt <= f.as_of_attempt)
  and (f.cuts is null or not list_bool_or(list_transform(f.cuts, lambda c: c.attempt > s.attempt and s.step > c.step
                                                                  and (f.as_of_attempt is null or c.attempt <= f.as_of_attempt))))
qualify row_number() over (partition by coalesce(f.run_id, s.run_id), s.step order by s.attempt desc, s.seq desc) = 1;

-- every drops event: at the trained length and probed ahead of a context extension
create or replace view drops_all as
select * from {{kind:drops}};

-- token drops at the length the run trains at, one row per step and attempt
create or replace view drops as
select * from drops_all where not coalesce(probe, false);

-- drops measured at a longer length ahead of a context extension (no update was made)
create or replace view drop_probes as
select * from drops_all where coalesce(probe, false);

create or replace view eval_events as
select * from {{kind:eval}};

-- every eval: the typed `eval` events, and for a run that has none, its metrics events holding an
-- eval loss (`eval/loss` or `val/loss`), as `steps_all` reads a `runledger.log` run's steps
create or replace view evals as
select * from eval_events
union all by name
select event_id, run_id, producer, attempt, seq, kind, time, ts, step, schema_version, prev_hash, hash, payload,
       stream_seq, ingested_at, coalesce("metrics/eval/loss", "metrics/val/loss") as loss
from metrics_checked
where coalesce("metrics/eval/loss", "metrics/val/loss") is not null
  and run_id not in (select run_id from eval_events);

create or replace view checkpoints as
select * from {{kind:checkpoint}};

create or replace view data as
select * from {{kind:data}};

create or replace view forecasts as
select * from {{kind:forecast}};

create or replace view alerts as
select * from {{kind:alert}};

-- the pages people took (`alert_ack`): which alert of the run, by whom, how (webhook, dashboard, cli), when (ts);
-- only a person's producer (cli, ui) or notify's ack listener gives one, the ledger quarantines any other's
create or replace view alert_acks as
select * from {{kind:alert_ack}};

-- the alerts open now. An alert is its producer's (its `agent` is its producer: runledger.ledger.contract.roles):
-- raised and resolved by (run_id, alert_id, producer), so another producer's event with the same
-- alert_id neither closes nor rewrites it; a person's resolution (producer {{person_producers}}) closes it
create or replace view open_alerts as
with last_raised as (
    select * from alerts where state = 'open'
    qualify row_number() over (partition by run_id, alert_id, producer order by stream_seq desc, seq desc) = 1
)
select r.* from last_raised r
where not exists (  -- a resolution after it (one message may hold a chain's alert and its resolution)
    select 1 from alerts x
    where x.state = 'resolved' and x.run_id = r.run_id and x.alert_id = r.alert_id
      and (x.stream_seq > r.stream_seq or (x.stream_seq = r.stream_seq and x.seq > r.seq))
      and (x.producer = r.producer or x.producer in ({{person_producers}}))
);

create or replace view decisions as
select * from {{kind:decision}};

create or replace view decisions_applied as
select * from {{kind:decision_applied}};

create or replace view runs_finished as
select * from {{kind:run_finished}};

-- where an attempt of a run's producer stops counting: the first step a later attempt logged (a resumed
-- run re-does the steps after its checkpoint, so the earlier attempt's from there on are superseded), or
-- the step after a later rewind's (`forks`), whichever comes first.
-- Only attempts that have a later one are listed, found from `run_started` (one per attempt), so that
-- a run of one attempt, the common case, costs no scan of its metrics.
create or replace view metric_attempts as
select * from (
    select run_id, producer, attempt,
           min(first_step) over (partition by run_id, producer order by attempt desc
                                 rows between unbounded preceding and 1 preceding) as superseded_from
    from (select run_id, producer, attempt, min(first_step) as first_step
          from (select run_id, producer, attempt, min(step) as first_step
                from (select run_id, producer from runs group by all having count(distinct attempt) > 1)
                     join metric_events using (run_id, producer)
                group by all
                union all
                select run_id, producer, attempt, fork_step + 1 from forks where how = 'rewind')
          group by all))
where superseded_from is not null;

-- the metrics events that count: each step from the latest attempt that logged it (the steps an
-- attempt logged before the next one started, and all of the last one's); for a fork, its parent's up to
-- the fork step (through a fork of a fork: fork_lines) with run_id the fork's, and its own after
create or replace view metric_events_latest as
select m.* replace (coalesce(f.run_id, m.run_id) as run_id)
from metrics_wide m
left join metric_attempts a using (run_id, producer, attempt)
left join fork_reads f on f.source_run = m.run_id
where (a.superseded_from is null or m.step < a.superseded_from)
  and (f.step_lo is null or m.step > f.step_lo) and (f.step_hi is null or m.step <= f.step_hi)
  and (f.as_of_attempt is null or m.attempt <= f.as_of_attempt);

-- the long form of metrics events (a view's name): one row per name logged, from its column or the MAP
-- of the names past the bound; `nonfinite` is 'nan', 'inf' or '-inf' where the value was not finite
-- (its value is null: JSON has no NaN)
create or replace macro metrics_long(events) as table
select run_id, producer, attempt, seq, step, time, metric_key(substr(key, 9)) as key, value, null::varchar as nonfinite
from (unpivot (select * exclude (no_metric, "metrics/") from query_table(events))
      on columns('^metrics/') into name key value value)
union all
select run_id, producer, attempt, seq, step, time, narrow_key as key, narrow_value as value, null::varchar as nonfinite
from (select *, unnest(map_keys("metrics/")) as narrow_key, unnest(map_values("metrics/")) as narrow_value
      from query_table(events) where "metrics/" is not null)
where narrow_value is not null
union all
select run_id, producer, attempt, seq, step, time, key, null::double as value, kind_of_value as nonfinite
from (select *, unnest(map_keys(nonfinite)) as key, unnest(map_values(nonfinite)) as kind_of_value from query_table(events));

-- free-form metrics (`runledger.log`) in long form, every attempt. (A query of one metric is faster
-- through `metric(name)` below, which reads that metric's own column.)
create or replace view metrics_all as
select * from metrics_long('metrics_wide');

-- the same, each step from the latest attempt that logged it
create or replace view metrics as
select run_id, attempt, step, key, value, time, nonfinite from metrics_long('metric_events_latest');

-- the error of `metric(name)` for a name no run logged: the logged names closest to it
create or replace macro metric_unknown(name) as
'metric(' || to_json(name)::varchar || '): no run logged this name' || coalesce(
    '; did you mean ' || (select string_agg(to_json(key)::varchar, ', ' order by score desc, key)
                         from (select key, jaro_winkler_similarity(lower(name), lower(key)) as score
                               from (select distinct key from metrics_all)
                               order by score desc, key limit 3)
                         where score >= 0.8) || '?',
    ' (`select distinct key from metrics` lists the names logged)');

-- one metric by its name, each step from the latest attempt that logged it: `select step, value from
-- metric('train/loss') where run_id = 'r'`, the rows of `metrics` whose key is the name (a value, or
-- null with `nonfinite` saying why), read from that metric's own column, where the long form above
-- unpivots every name first: the fast way to ask for one metric. A name no run logged is an error
-- naming the names closest to it (a typo: `metric('train/los')`), never an empty answer.
create or replace macro metric(name) as table
with logged as (
    select run_id, attempt, step, time, value, case when value is null then nonfinite[name] end as nonfinite
    from (select *, coalesce(in_column, "metrics/"[name]) as value
          from (select *, coalesce(*columns(lambda c: starts_with(c, 'metrics/') and metric_key(substr(c, 9)) = name
                                                      or c = 'no_metric')) as in_column
                from metric_events_latest))
    where value is not null or nonfinite[name] is not null)
select * from logged
union all
select null, null, null, null, null, error(metric_unknown(name))
where not exists (select 1 from logged);

-- the machine's metrics (`runledger.init(system_metrics=...)`), as stored ("metrics/NAME" columns) and in
-- long form: CPU, memory, disk, network (psutil), GPUs (NVML), JAX devices' memory
create or replace view system_events as
select * from {{kind:system}};

create or replace view system_samples as
select * from system_events
union all by name
select null::double as "metrics/cpu/percent", null::map(varchar, double) as "metrics/" where false;

create or replace view system_metrics as
select run_id, producer, attempt, seq, step, time, metric_key(substr(key, 9)) as key, value
from (unpivot (select * exclude ("metrics/") from system_samples) on columns('^metrics/') into name key value value)
union all
select run_id, producer, attempt, seq, step, time, narrow_key as key, narrow_value as value
from (select *, unnest(map_keys("metrics/")) as narrow_key, unnest(map_values("metrics/")) as narrow_value
      from system_samples where "metrics/" is not null)
where narrow_value is not null;

-- runs deleted (`runledger delete`): the tombstone of each, kept when the run's other rows went: who,
-- when, and the chains (producer, attempt, up to seq and hash) and events it covers
create or replace view tombstones as
select * from {{kind:tombstone}};

-- config keys set after a run started (`run.config[k] = v`)
create or replace view config_updates as
select * from {{kind:config}};

-- checkpoints attested (`runledger.ledger.attest`): the folder, the digest model signing signed, and the
-- SHA-256 of its in-toto SLSA provenance statement (what `runledger attest verify` matches the statement to)
create or replace view attestations as
select * from {{kind:attestation}};

-- files a run saved (`runledger.save`, `log_artifact`): their path, SHA-256 and size when recorded
create or replace view artifacts as
select * from {{kind:artifact}};

-- histograms a run logged (`runledger.Histogram`, a list or an array given to `log`, Levanter's SummaryStats),
-- one row each at its step under its name (`key`): edges and counts (JSON lists, as logged), count, min, max,
-- sum, sum_squares, and nonfinite (values left out of the buckets)
create or replace view histograms as
select * from {{kind:histogram}};

-- every bucket of every histogram, one row each: bucket (from 0) counts `count` values in [lo, hi) (the
-- last bucket closed); what the run page's heat map draws
create or replace view histogram_buckets as
select run_id, producer, attempt, seq, step, ts, key, i - 1 as bucket, e[i] as lo, e[i + 1] as hi, c[i] as count
from (select run_id, producer, attempt, seq, step, ts, key, from_json(edges, '["DOUBLE"]') as e,
             from_json(counts, '["DOUBLE"]') as c, unnest(range(1, json_array_length(counts)::bigint + 1)) as i
      from {{kind:histogram}});

-- tables a run logged (`runledger.Table`), one row each: columns and rows (JSON lists, as logged, cut to the
-- contract's bound) and rows_logged (the rows the table had)
create or replace view logged_tables as
select * from {{kind:table}};

-- every row of every logged table, one row each: `row_index` from 0, `cells` a JSON list in the order of
-- `columns`; `text` the cells joined by tabs, for a search (`where text ilike '%word%'`)
create or replace view table_rows as
select run_id, producer, attempt, seq, step, ts, key, i - 1 as row_index, columns, r[i] as cells,
       array_to_string(list_transform(from_json(r[i], '["JSON"]'),
                                      lambda c: coalesce(json_extract_string(c, '$'), '')), chr(9)) as text
from (select run_id, producer, attempt, seq, step, ts, key, columns, from_json(rows, '["JSON"]') as r,
             unnest(range(1, json_array_length(rows)::bigint + 1)) as i
      from {{kind:table}});

-- files and images a run logged (`runledger.Image`, `runledger.File`), one row each: the blob's sha256 (its
-- bytes at {root}/media/{sha256}, which `runledger verify` checks), bytes, type (a media type), name, caption,
-- width and height (of a PNG)
create or replace view media as
select * from {{kind:media}};

-- what a run's script wrote to stdout and stderr (`runledger.init(console=True)`, the default), as sent: one row
-- per batch of lines (`lines` a JSON list), `first` the number of its first line in its stream, `dropped` the
-- lines left out just before them (the rate bound), `cut` the lines of it cut to 4,096 characters
create or replace view console as
select * from {{kind:console}};

-- every console line, one row each: its stream, its number in the stream (per attempt), its text, and the step
-- the run was at when it was sent
create or replace view console_lines as
select run_id, producer, attempt, seq, step, ts, stream, first + i - 1 as line_no, l[i] as text
from (select run_id, producer, attempt, seq, step, ts, stream, first, from_json(lines, '["VARCHAR"]') as l,
             unnest(range(1, json_array_length(lines)::bigint + 1)) as i
      from {{kind:console}});

-- input the ledger refused, with the raw bytes, the subject and the reason
create or replace view quarantine as
select * from {{quarantine}};

-- ---------------------------------------------------------------------------------------------
-- Audit helpers (queries/health, provenance, forecast). `audit.py` materialises the small ones
-- (run_plan, run_thresholds, run_blocks, lr_segments, step_cells, step_blocks, step_progress) as temp
-- tables of the same name before a suite runs, so the steps are read once per suite and each check
-- reads a few rows per block; run alone through `runledger sql` they are plain views.
-- ---------------------------------------------------------------------------------------------

-- every run the ledger knows of, whatever kinds it has (an audit reports on each, skipping what is
-- absent); from the snapshot's partitions (or the partition directories' names), so no file is opened
create or replace view audit_runs as
{{audit_runs}};

-- what each run declared in its first run_started: budget, schedule, experts, plan; one row per run.
-- horizon_steps: the schedule's, else its token horizon, else the token budget, in steps (rounded up,
-- as training/schedule.horizon_steps_for_tokens does); min_lr_ratio defaults to 0.05 (Marin: decay
-- to 5% of peak).
create or replace view run_plan as
with starts as (
    -- one scan of runs for both ends (each view below binds this one again)
    select
        *,
        row_number() over (partition by run_id order by attempt, ts, seq) as first_rank,
        row_number() over (partition by run_id order by attempt desc, ts desc, seq desc) as latest_rank
    from runs
), first_start as (
    select * exclude (first_rank, latest_rank) from starts where first_rank = 1
), latest_start as (
    select run_id, thresholds from starts where latest_rank = 1
), parsed as (
    select
        f.run_id, f.token_budget, f.config, f.config_hash, f.schedule, f.planned_tokens_per_s,
        l.thresholds,
        coalesce((f.schedule ->> 'tokens_per_step')::bigint, f.tokens_per_step) as tokens_per_step,
        (f.schedule ->> 'peak_lr')::double as peak_lr,
        coalesce((f.schedule ->> 'warmup_steps')::bigint, 0) as warmup_steps,
        coalesce((f.schedule ->> 'min_lr_ratio')::double, 0.05) as min_lr_ratio,
        (f.schedule ->> 'horizon_steps')::bigint as schedule_horizon_steps,
        (f.schedule ->> 'horizon_tokens')::bigint as horizon_tokens,
        (f.schedule ->> 'anchor_step')::bigint as anchor_step,
        (f.schedule ->> 'anchor_lr')::double as anchor_lr,
        (f.config -> 'moe' ->> 'n_experts')::bigint as n_experts,
        coalesce(f.config ->> 'health', 'default') as health,
        f.config ->> 'loss_unit' as loss_unit,
        try_cast(f.config ->> 'bytes_per_token' as double) as bytes_per_token,
        (f.config ->> 'ckpt_every')::bigint as ckpt_every,
        (f.config ->> 'planned_mfu')::double as planned_mfu
    from first_start f join latest_start l using (run_id)
)
select
    *,
    coalesce(schedule_horizon_steps, ceil(horizon_tokens / tokens_per_step)::bigint,
             ceil(token_budget / tokens_per_step)::bigint) as horizon_steps
from parsed;

-- the default thresholds, with the unit and the anchor each comes from (rendered from
-- queries/thresholds.py, the one place they are defined); a run overrides any of them by name in its
-- run_started.thresholds, or by its former name (`formerly`) where it does not set the new one
create or replace view threshold_defaults as
select * from (values
    {{threshold_defaults}}
) as t(name, value, unit, anchor, formerly, per_token, loss_form);

-- the thresholds of each named health profile that differ from the defaults (queries/thresholds.py:
-- `runledger.init(health="marin")` records the profile as the config key "health")
create or replace view threshold_profiles as
select * from (values
    {{threshold_profiles}}
) as t(profile, name, value);

-- what each run's loss is averaged over, and what that does to its profile's loss thresholds
-- (queries/thresholds.py, "The loss's unit"): Marin's per-token numbers judge a loss declared per token;
-- a per-byte loss with bytes_per_token gets them divided by it; any other (or undeclared) loss gets the
-- default relative form of the loss checks. `note`: the one line the loss checks' evidence carries
-- (null under the default profile, whose loss checks hold no absolute loss number).
create or replace view run_loss_unit as
select
    run_id, health as profile, loss_unit, bytes_per_token,
    case when loss_unit = 'token' then 'token'
         when loss_unit = 'byte' and bytes_per_token > 0 then 'converted'
         else 'default' end as applies,
    case when health = 'default' then null
         when loss_unit = 'token' then 'loss per token: profile ' || health || '''s per-token loss numbers apply'
         when loss_unit = 'byte' and bytes_per_token > 0
             then 'loss per byte: profile ' || health || '''s per-token loss numbers divided by '
                  || bytes_per_token || ' bytes per token'
         else coalesce('loss per ' || loss_unit, 'loss unit undeclared') || ': profile ' || health
              || '''s per-token loss numbers not applied; the default relative form judges' end as note
from run_plan;

-- the thresholds in force for each run: the defaults, else its health profile's (run_plan.health),
-- overridden by run_started.thresholds (what the audit and the agents read); a negative value turns
-- that form of a check off. A loss check's form and its per-token numbers follow run_loss_unit.
create or replace view run_thresholds as
with given as (
    select
        r.run_id, d.name, d.value, d.anchor, d.per_token, d.loss_form, coalesce(p.health, 'default') as profile,
        q.value as in_profile, coalesce(u.applies, 'default') as applies, u.bytes_per_token,
        coalesce(json_extract(p.thresholds, '$.' || d.name),
                 json_extract(p.thresholds, '$.' || d.formerly))::double as given
    from audit_runs r
    cross join threshold_defaults d
    left join run_plan p using (run_id)
    left join run_loss_unit u using (run_id)
    left join threshold_profiles q on q.profile = coalesce(p.health, 'default') and q.name = d.name
), in_unit as (
    -- a loss check's profile form stands only on a per-token (or converted) loss; a per-token number is
    -- divided by the bytes per token of a per-byte loss (an OFF, negative, stays OFF)
    select
        *,
        coalesce(case when loss_form and applies = 'default' then null else in_profile end, value) as ruled,
        case when loss_form and applies = 'default' then null else in_profile end as in_force
    from given
)
select
    run_id, name,
    coalesce(given, case when per_token and applies = 'converted' and ruled >= 0
                         then ruled / bytes_per_token else ruled end) as value,
    case when given is not null then 'run_started.thresholds'
         else (case when in_force is not null then 'profile ' || profile else anchor end)
              || (case when per_token and applies = 'converted' and ruled >= 0 then ' (divided by bytes_per_token)'
                       else '' end) end as source
from in_unit;

-- the fork audit's window (queries/fork): for each fork (its first fork start), every step after its fork step
-- that it and its parent both logged, the last fork_window_steps of them (0: all), the two runs' steps side
-- by side (the fork's own rows; the parent's from its `steps`, spliced where it is a fork too)
create or replace view fork_window as
with pairs as (
    select f.run_id, f.parent_run, f.fork_step, s.step, s.kind,
           s.loss, p.loss as parent_loss, s.mfu, p.mfu as parent_mfu,
           row_number() over (partition by f.run_id order by s.step desc) as from_end
    from (select * from forks where how = 'fork' and parent_run <> run_id
          qualify row_number() over (partition by run_id order by attempt) = 1) f
    join steps s on s.run_id = f.run_id and s.from_run = f.run_id and s.step > f.fork_step
    join steps p on p.run_id = f.parent_run and p.step = s.step
)
select x.* exclude (from_end)
from pairs x
join run_thresholds w on w.run_id = x.run_id and w.name = 'fork_window_steps'
where w.value <= 0 or x.from_end <= w.value;

-- the other runs of each run's ladder: the same run_started.ladder name, or the rungs a forecast for it used
create or replace view ladder_peers as
select distinct a.run_id, b.run_id as peer
from runs a
join runs b on b.ladder ->> 'name' = a.ladder ->> 'name'
where b.run_id <> a.run_id
union
select distinct target_run as run_id, unnest(from_json(rungs, '["VARCHAR"]')) as peer
from forecasts;

-- steps per block for each run: the block_steps threshold if set, else 1% of the horizon, else 100
create or replace view run_blocks as
select
    a.run_id,
    greatest(1, coalesce(nullif(w.value, 0)::bigint, p.horizon_steps // 100, 100)) as block_steps
from audit_runs a
left join run_plan p using (run_id)
left join run_thresholds w on w.run_id = a.run_id and w.name = 'block_steps';

-- the width of the time buckets health/telemetry_silence counts gaps between (and step_cells groups
-- steps by), in microseconds: half the smallest silence_max_s of the audited runs, so that a gap
-- longer than any run's threshold spans an empty bucket; at least 1 us, the timestamps' resolution
create or replace view silence_bucket as
select greatest((min(value) * 1e6 / 2)::bigint, 1) as us
from run_thresholds
where name = 'silence_max_s';

-- The rule "grad norm rising" (Marin checklist: grad-norm rate of change): across a trailing window
-- of window_blocks blocks (of run_blocks' block_steps steps) with a grad norm, the least-squares
-- slope of grad_norm over step, times the window's span in steps, over its mean grad norm, is above
-- grad_norm_rise_max. health/grad_norm_trend judges every window of a run, evidence/grad_norm the
-- latest one (for the grad-norm agent).
create or replace macro grad_norm_rise(slope, step_lo, step_hi, mean_grad_norm) as
    slope * (step_hi - step_lo) / nullif(mean_grad_norm, 0);

-- training/schedule.lr_at in SQL, the same three cases (steps are 1-based): warmup linear to peak at
-- `warmup`; then linear from peak (or from anchor_lr at anchor_step, after a retime) to ratio*peak at
-- `horizon`; ratio*peak from the horizon on.
create or replace macro scheduled_lr(step, peak, warmup, horizon, ratio, anchor_step, anchor_lr) as
    case
        when step >= horizon then ratio * peak
        when anchor_step is not null and step >= anchor_step
            then anchor_lr + (ratio * peak - anchor_lr) * (step - anchor_step) / greatest(horizon - anchor_step, 1)
        when step < warmup then peak * greatest(step, 1) / warmup
        else peak + (ratio * peak - peak) * (step - warmup) / greatest(horizon - warmup, 1)
    end;

-- the learning-rate schedule each step is held to (health/lr_schedule): per run, one row per range of
-- attempts (attempt_lo..attempt_hi) and of steps (from_step..until_step - 1), with the `scheduled_lr`
-- arguments in force there and the tolerance (lr_rel_tol x peak).
--
-- Recomputed from run_started.schedule and the applied set_token_horizon decisions. A step of attempt
-- a is held to the latest run_started (with a peak_lr) of an attempt <= a and to the decisions applied
-- in attempts <= a, so the schedule only changes at the attempt of such an event (a key): the rows
-- of a key hold for every attempt up to the next key. A decision_applied of step s - 1 (emitted
-- between updates s - 1 and s: it governs from update s) whose `after` (the schedule in force, as
-- runledger.ledger.contract.events.ACTIONS types it) has a new horizon (`after.horizon_steps`, else
-- `after.horizon_tokens` / tokens_per_step) retimes the decay: from s the lr goes linearly from lr(s)
-- to min_lr_ratio * peak at the new horizon (before the end of warmup only the horizon moves).
-- Re-applying a retime already in a resumed schedule changes nothing (the line through the same
-- anchor), so a resumed run can carry it either way.
create or replace view lr_segments as
with recursive starts as (
    select
        run_id, attempt,
        (schedule ->> 'peak_lr')::double as peak,
        coalesce((schedule ->> 'warmup_steps')::bigint, 0) as warmup,
        coalesce((schedule ->> 'min_lr_ratio')::double, 0.05) as ratio,
        coalesce((schedule ->> 'tokens_per_step')::bigint, tokens_per_step) as tps,
        (schedule ->> 'horizon_steps')::bigint as horizon_steps,
        (schedule ->> 'horizon_tokens')::double as horizon_tokens,
        token_budget,
        (schedule ->> 'anchor_step')::bigint as anchor_step,
        (schedule ->> 'anchor_lr')::double as anchor_lr
    from runs
    qualify row_number() over (partition by run_id, attempt order by ts, seq) = 1
), bases as (
    select
        * exclude (horizon_steps, horizon_tokens, token_budget),
        coalesce(horizon_steps, ceil(horizon_tokens / tps)::bigint, ceil(token_budget / tps)::bigint) as horizon
    from starts
    where peak is not null
), applied as (
    select
        run_id, attempt as decided_in, ts, seq,
        step + 1 as from_step,
        (after ->> 'horizon_steps')::bigint as horizon_steps,
        (after ->> 'horizon_tokens')::double as horizon_tokens
    from decisions_applied
    where action = 'set_token_horizon' and status = 'applied'
), keys as (
    select run_id, attempt from bases
    union
    select run_id, decided_in from applied
), attempts as (
    -- each key, the last attempt it holds for, and the run_started it runs under
    select k.run_id, k.attempt, k.attempt_hi, b.attempt as base_attempt
    from (
        select
            run_id, attempt,
            coalesce(lead(attempt) over (partition by run_id order by attempt) - 1, 9223372036854775807) as attempt_hi
        from keys
    ) k
    asof join bases b on k.run_id = b.run_id and k.attempt >= b.attempt
), retimes as (
    select
        a.run_id, a.attempt,
        row_number() over (partition by a.run_id, a.attempt order by d.from_step, d.ts, d.seq) as i,
        d.from_step,
        coalesce(d.horizon_steps, ceil(d.horizon_tokens / b.tps)::bigint) as horizon
    from attempts a
    join bases b on b.run_id = a.run_id and b.attempt = a.base_attempt
    join applied d on d.run_id = a.run_id and d.decided_in <= a.attempt
    where d.from_step is not null and coalesce(d.horizon_steps, d.horizon_tokens) is not null
), segments(run_id, attempt, i, from_step, horizon, anchor_step, anchor_lr) as (
    -- the schedule in force from each retime on, each built on the one before (as schedule.retime does)
    select a.run_id, a.attempt, 0::bigint, 0::bigint, b.horizon, b.anchor_step, b.anchor_lr
    from attempts a
    join bases b on b.run_id = a.run_id and b.attempt = a.base_attempt
    union all
    select
        s.run_id, s.attempt, r.i, r.from_step, r.horizon,
        case when r.from_step >= b.warmup then r.from_step else s.anchor_step end,
        case when r.from_step >= b.warmup
             then scheduled_lr(r.from_step, b.peak, b.warmup, s.horizon, b.ratio, s.anchor_step, s.anchor_lr)
             else s.anchor_lr end
    from segments s
    join retimes r on r.run_id = s.run_id and r.attempt = s.attempt and r.i = s.i + 1
    join attempts a on a.run_id = s.run_id and a.attempt = s.attempt
    join bases b on b.run_id = a.run_id and b.attempt = a.base_attempt
)
select
    g.run_id, g.attempt as attempt_lo, a.attempt_hi, g.from_step,
    coalesce(lead(g.from_step) over (partition by g.run_id, g.attempt order by g.i), 9223372036854775807) as until_step,
    b.peak, b.warmup, b.ratio, g.horizon, g.anchor_step, g.anchor_lr, t.value * b.peak as tolerance
from segments g
join attempts a using (run_id, attempt)
join bases b on b.run_id = a.run_id and b.attempt = a.base_attempt
join run_thresholds t on t.run_id = g.run_id and t.name = 'lr_rel_tol';

-- per (run, attempt, block of block_steps steps, time bucket of silence_bucket): the sufficient
-- statistics the health checks need, from the one pass over the steps an audit makes. step_blocks
-- sums them per block; health/telemetry_silence reads the buckets' first and last step times. The
-- lr_* columns compare each step's lr with lr_segments' schedule (lr_n: steps held to one; lr_off:
-- steps off by more than the tolerance, the first at lr_off_step). Steps without a step number are
-- kept (block null) for the buckets.
create or replace view step_cells as
with held as (
    select
        s.run_id, s.attempt, s.step, s.ts, s.tokens, s.grad_norm, s.loss, s.param_norm, s.router_entropy,
        s.mfu, s.tokens_per_s, s.lr, z.block_steps, (s.step - 1) // z.block_steps as block,
        epoch_us(s.ts) // w.us as bucket,
        g.peak as lr_peak, g.tolerance as lr_tolerance,
        scheduled_lr(s.step, g.peak, g.warmup, g.horizon, g.ratio, g.anchor_step, g.anchor_lr) as lr_expected
    from steps_all s
    join run_blocks z using (run_id)
    cross join silence_bucket w
    left join lr_segments g
        on g.run_id = s.run_id and s.attempt >= g.attempt_lo and s.attempt <= g.attempt_hi
        and s.step >= g.from_step and s.step < g.until_step
), checked as (
    select *, abs(lr - lr_expected) as lr_err from held
)
select
    run_id, attempt, block, bucket, any_value(block_steps) as block_steps,
    count(*) as n, min(step) as step_lo, max(step) as step_hi, min(ts) as ts_lo, max(ts) as ts_hi,
    sum(tokens) as tokens,
    count(grad_norm) as g_n, sum(grad_norm) as g_sy, max(grad_norm) as g_max,
    sum(step::double) filter (grad_norm is not null) as g_sx,
    sum(step::double * step) filter (grad_norm is not null) as g_sxx,
    sum(step * grad_norm) as g_sxy, sum(grad_norm * grad_norm) as g_syy,
    count(loss) as l_n, sum(loss) as l_sy, min(loss) as l_min,
    count(param_norm) as p_n,
    min(step) filter (param_norm is not null) as p_first_step,
    arg_min(param_norm, step) filter (param_norm is not null) as p_first,
    max(step) filter (param_norm is not null) as p_last_step,
    arg_max(param_norm, step) filter (param_norm is not null) as p_last,
    count(router_entropy) as re_n, sum(router_entropy) as re_sy,
    count(mfu) as mfu_n, sum(mfu) as mfu_sy,
    count(tokens_per_s) as tps_n, sum(tokens_per_s) as tps_sy,
    count(lr_peak) as lr_n, max(lr_err) as lr_err, any_value(lr_peak) as lr_peak,
    count(*) filter (lr_err > lr_tolerance) as lr_off,
    min(step) filter (lr_err > lr_tolerance) as lr_off_step,
    arg_min(lr, step) filter (lr_err > lr_tolerance) as lr_off_lr,
    arg_min(lr_expected, step) filter (lr_err > lr_tolerance) as lr_off_expected
from checked
group by run_id, attempt, block, bucket;

-- per (run, attempt, block of `block_steps` steps): the sufficient statistics the health checks
-- need (counts, sums for regr_slope, extremes, first/last, the lr against its schedule), so that a
-- check over a 400k-step run reads a few hundred rows; block_steps is run_blocks' (the block_steps
-- threshold, or 1% of the horizon, or 100). Summed from step_cells, the floating-point sums in
-- bucket order (their rounding would otherwise depend on the order the cells come in, which differs
-- from one plan to another).
create or replace view step_blocks as
select
    run_id, attempt, block, any_value(block_steps) as block_steps,
    sum(n)::bigint as n, min(step_lo) as step_lo, max(step_hi) as step_hi,
    sum(tokens) as tokens,
    sum(g_n)::bigint as g_n, sum(g_sy order by bucket) as g_sy, max(g_max) as g_max,
    sum(g_sx order by bucket) as g_sx, sum(g_sxx order by bucket) as g_sxx, sum(g_sxy order by bucket) as g_sxy,
    sum(g_syy order by bucket) as g_syy,
    sum(l_n)::bigint as l_n, sum(l_sy order by bucket) as l_sy, min(l_min) as l_min,
    sum(p_n)::bigint as p_n, arg_min(p_first, p_first_step) as p_first, arg_max(p_last, p_last_step) as p_last,
    sum(re_n)::bigint as re_n, sum(re_sy order by bucket) / nullif(sum(re_n), 0) as re_mean,
    sum(mfu_n)::bigint as mfu_n, sum(mfu_sy order by bucket) / nullif(sum(mfu_n), 0) as mfu_mean,
    sum(tps_n)::bigint as tps_n, sum(tps_sy order by bucket) / nullif(sum(tps_n), 0) as tps_mean,
    sum(lr_n)::bigint as lr_n, max(lr_err) as lr_err, any_value(lr_peak) as lr_peak,
    sum(lr_off)::bigint as lr_off, min(lr_off_step) as lr_off_step,
    arg_min(lr_off_lr, lr_off_step) as lr_off_lr, arg_min(lr_off_expected, lr_off_step) as lr_off_expected
from step_cells
where block is not null
group by run_id, attempt, block;

-- per (run, block): the latest attempt's block, with the tokens seen by its end and its mean loss
-- (the observed side of forecast vs actual)
create or replace view step_progress as
with latest as (
    select * from step_blocks
    qualify row_number() over (partition by run_id, block order by attempt desc) = 1
)
select
    run_id, block, step_lo, step_hi, l_n, l_sy / nullif(l_n, 0) as loss_mean,
    sum(tokens) over (partition by run_id order by block) as tokens_seen
from latest;

-- per (run, sequence length): the noise of its per-step loss (what the loss checks' default forms count
-- in), sigma = 1.4826 x the median absolute deviation of the step-to-step changes of the loss / sqrt(2):
-- robust to the trend (a change's mean) and to the spikes the checks look for (a median); from every
-- attempt, each step against the one before it in the same attempt at the same sequence length (a context
-- extension changes the loss's level and its noise: at 1024 bytes the toy worker's batch is one sequence,
-- whose loss ranges over nats where 16 of 128 varied by tenths). seq_len is null where steps report none
-- (a user's loop): one stretch, the whole run. loss_changes: each step's change, once for both views below.
create or replace view loss_changes as
select * from (
    select run_id, seq_len,
           loss - lag(loss) over (partition by run_id, producer, attempt, seq_len order by step) as change
    from steps_all
    where loss is not null)
where change is not null;

create or replace view loss_noise_by_len as
with centred as (
    select run_id, seq_len, change, median(change) over (partition by run_id, seq_len) as mid from loss_changes
)
select run_id, seq_len, count(*) as changes, 1.4826 * median(abs(change - mid)) / sqrt(2) as sigma
from centred
group by run_id, seq_len;

-- per run: the same noise over all its stretches (the changes within each, pooled; a run of one sequence
-- length: its own)
create or replace view loss_noise as
with centred as (
    select run_id, change, median(change) over (partition by run_id) as mid from loss_changes
)
select run_id, count(*) as changes, 1.4826 * median(abs(change - mid)) / sqrt(2) as sigma
from centred
group by run_id;

-- per (target run, plan, fraction): the latest forecast point of each plan the run had: the plan as
-- registered (revision 0, no decision) and each revision an applied decision caused (its decision_id,
-- from_step/from_tokens where it began to govern), at target_tokens (else fraction x the target's
-- token_budget). in_force: the point lies where its plan governed the run, after its start and up to
-- the next plan's; what forecast vs actual and the forecast_hit check judge. The fields revisions
-- added are read from the payload, so a ledger of forecasts older than them reads as one plan.
create or replace view forecast_points as
with f as (
    select
        f.*, payload ->> 'decision_id' as plan_decision,
        coalesce((payload ->> 'revision')::bigint, 0) as plan_revision,
        coalesce((payload ->> 'from_tokens')::bigint, 0) as plan_from_tokens,
        (payload ->> 'from_step')::bigint as plan_from_step,
        (payload ->> 'horizon_tokens')::bigint as plan_horizon_tokens,
        coalesce((payload ->> 'supported')::boolean, true) as plan_supported,
        (payload ->> 'band_level')::double as plan_band_level
    from forecasts f
), latest as (
    select * from f
    qualify row_number() over (partition by target_run, coalesce(plan_decision, ''), fraction
                               order by ts desc, seq desc) = 1
), plans as (
    select target_run, coalesce(plan_decision, '') as plan_key, min(plan_from_tokens) as from_tokens
    from latest group by all
), bounded as (
    select *, lead(from_tokens) over (partition by target_run order by from_tokens, plan_key) as until_tokens
    from plans
), points as (
    select
        l.target_run as run_id, l.fraction, l.projected_loss, l.band_low, l.band_high, l.rungs, l.flags,
        l.ts as forecast_at, l.run_id as forecast_by_run,
        coalesce(l.target_tokens, l.fraction * p.token_budget) as at_tokens,
        l.plan_revision as revision, l.plan_decision as decision_id, l.plan_from_step as from_step,
        l.plan_horizon_tokens as horizon_tokens, b.from_tokens, b.until_tokens, l.plan_supported as supported,
        l.plan_band_level as band_level
    from latest l
    join bounded b on b.target_run = l.target_run and b.plan_key = coalesce(l.plan_decision, '')
    left join run_plan p on p.run_id = l.target_run
)
select *, at_tokens > from_tokens and (until_tokens is null or at_tokens <= until_tokens) as in_force
from points;

-- one row per run, its attempts a column (`runledger runs`): project, name, id, the state of its latest
-- attempt, how many attempts, how many steps it logged (metrics or the trainer's steps), the last value
-- of its first three metric names (by name, each at its latest step), its start and how long it ran (to
-- its last start, step, metrics, heartbeat or finish)
create or replace view run_list as
with a as (
    select run_id, arg_min(project, ts) as project, coalesce(arg_min(name, ts), run_id) as name,
           arg_max(state, ts) as state, count(distinct attempt) as attempts, min(ts) as started_at, max(ts) as last_ts
    from runs group by run_id),
s as (
    select run_id, count(distinct step) as steps, max(ts) as last_ts
    from (select run_id, step, ts from {{kind:metrics}} union all select run_id, step, ts from {{kind:step}})
    where step is not null group by run_id),
v as (
    select run_id, map_from_entries(list({'k': key, 'v': value} order by key)[1:3]) as last_values
    from (select run_id, key, arg_max(value, step) as value from metrics where value is not null group by all)
    group by run_id),
e as (
    select run_id, max(ts) as last_ts
    from (select run_id, ts from {{kind:run_finished}} union all select run_id, ts from {{kind:heartbeat}})
    group by run_id)
select a.project, a.name, a.run_id, a.state, a.attempts, coalesce(s.steps, 0) as steps, v.last_values, a.started_at,
       epoch(greatest(a.last_ts, coalesce(s.last_ts, a.last_ts), coalesce(e.last_ts, a.last_ts)) - a.started_at)
           as duration_s
from a left join s using (run_id) left join v using (run_id) left join e using (run_id);
