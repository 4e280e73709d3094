-- A run's decision trail for its page: every decision (reviews folded in), with its evidence, its
-- review (who approved or rejected a proposed one, the first review counting, as ledger/decision_state
-- folds them) and the worker's answer. $run: the run id.
with made as (
    select * from decisions
    where run_id = $run and action not in ('approve', 'reject')
    qualify row_number() over (partition by decision_id order by stream_seq) = 1
), reviews as (
    select params ->> 'decision_id' as decision_id,
           arg_min(action, stream_seq) as review, arg_min(agent, stream_seq) as reviewed_by,
           arg_min(time, stream_seq) as reviewed_at
    from decisions
    where run_id = $run and action in ('approve', 'reject')
    group by all
), answered as (
    select decision_id, status, step as applied_at_step, time as applied_at, reason, before, after
    from decisions_applied
    where run_id = $run
    qualify row_number() over (partition by decision_id order by ts desc, seq desc) = 1
)
select
    m.decision_id, m.time as decided_at, m.step as decided_at_step, m.agent, m.rule, m.action, m.params, m.mode,
    m.rationale, m.evidence,
    case when m.mode = 'proposed' and r.review is null then 'proposed'
         when r.review = 'approve' then 'approved' when r.review = 'reject' then 'rejected' else 'decided' end as review,
    r.reviewed_by, r.reviewed_at,
    coalesce(a.status, 'not applied') as status, a.applied_at_step, a.applied_at, a.reason as refusal_reason,
    a.before, a.after, m.stream_seq
from made m
left join reviews r on r.decision_id = m.decision_id and m.mode = 'proposed'
left join answered a on a.decision_id = m.decision_id
order by m.stream_seq
