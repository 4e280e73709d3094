-- What was decided, on what evidence, by whom, and was it applied (at which step, by which producer)?
with made as (
    select
        run_id, decision_id, agent, producer as decided_by, rule, action, params, rationale, evidence, mode,
        ts as decided_at, step as decided_at_step
    from decisions
), applied as (
    select
        run_id, decision_id, status, producer as applied_by, attempt as applied_in_attempt,
        ts as applied_at, step as applied_at_step, before, after, reason
    from decisions_applied
    qualify row_number() over (partition by run_id, decision_id order by ts desc, seq desc) = 1
)
select
    coalesce(m.run_id, a.run_id) as run_id,
    coalesce(m.decision_id, a.decision_id) as decision_id,
    m.agent, m.decided_by, m.mode, m.rule, m.action, m.params, m.rationale, m.evidence,
    m.decided_at, m.decided_at_step,
    coalesce(a.status, 'not applied') as status,
    a.applied_by, a.applied_in_attempt, a.applied_at, a.applied_at_step, a.before, a.after, a.reason as refusal_reason,
    epoch(a.applied_at) - epoch(m.decided_at) as seconds_to_apply,
    m.decision_id is null as applied_without_a_decision
from made m
full join applied a on a.run_id = m.run_id and a.decision_id = m.decision_id
order by run_id, coalesce(m.decided_at, a.applied_at)
