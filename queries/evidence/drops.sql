-- Token-drop evidence for one run ($run_id): the trailing window at the trained length, and probes
-- at a longer length (before a scheduled context extension).
with trained as (
    select step, drop_fraction, dispatch, cf_send, cf_recv, seq_len
    from drops where run_id = $run_id
    qualify row_number() over (partition by step order by attempt desc, seq desc) = 1
    order by step desc limit $window
), probes as (
    select step, drop_fraction, seq_len
    from drop_probes where run_id = $run_id
    order by step desc limit $window
)
select 'trained' as what, step, drop_fraction, dispatch, cf_send, cf_recv, seq_len from trained
union all
select 'probe', step, drop_fraction, null, null, null, seq_len from probes
order by what, step
