"""Whose names producers take: agents' (`agent-*`) and persons' (`cli`, `ui`), which other roles may not use.

NATS cannot tell the ledger who published a message (JetStream strips the server's Nats-Request-Info
header before it stores one), so the ledger checks what an event claims against these names
(`runledger.ledger.contract.validation.speaker_problem`), and readers key an alert by its producer (`runledger.ledger.check.replay`,
the `open_alerts` view). Only the standard library: `queries` reads these without loading pydantic.
"""

from __future__ import annotations

AGENT_PREFIX = "agent-"  # the agents' producer names (agents/*.py NAME)
PERSON_PRODUCERS = ("cli", "ui")  # a person's: `runledger decide` and the dashboard (runledger.ledger.decisions.review)
ACK_PRODUCERS = (*PERSON_PRODUCERS, "notify")  # who may acknowledge an alert: a person, or notify's ack listener
PERSON_PREFIX = "person:"  # a person named in a payload's `agent` (runledger.ledger.decisions.review)


def is_person(producer: str) -> bool:
    """Whether `producer` is a person's: a person may resolve any alert."""
    return producer in PERSON_PRODUCERS


def is_agent_or_person(producer: str) -> bool:
    """Whether `producer` is a name only an agent or a person may use."""
    return producer.startswith(AGENT_PREFIX) or is_person(producer)


def may_acknowledge(producer: str) -> bool:
    """Whether `producer` may give an `alert_ack` (a person's, or notify's ack listener taking a webhook call)."""
    return producer in ACK_PRODUCERS


def signs_heads(producer: str) -> bool:
    """Whether a producer's chain carries signed heads (`chain_head`, a worker's kind): a worker's, not an
    agent's, a person's or notify's."""
    return not is_agent_or_person(producer) and producer not in ACK_PRODUCERS
