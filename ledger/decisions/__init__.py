"""Decisions: what a run must follow as they arrive (inbox), and a person's review of a proposed one
(review). What became of each decision is one pure fold of the contract (contract.decision_state)."""
