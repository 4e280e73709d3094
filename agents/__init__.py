"""Contingency agents: one pure policy per file (state + evidence → decisions), and their runner.

Each agent module has NAME (its producer name), EVIDENCE (a query under queries/) and
`decide(state, evidence, thresholds) -> list[Action]`; `runledger.agents.runner` runs them on the live stream.
"""
