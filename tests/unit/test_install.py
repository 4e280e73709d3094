"""The installed package as a user gets it: one import name (`runledger`), a base install without JAX,
optax, orbax or scipy that still logs, queries, verifies, replays and serves the dashboard, beside
OpenAI's Agents SDK (whose import name is `agents`) and beside a script's own `tools/`, `training/`,
`ledger/` and `agents/` folders; a command whose extra is missing says which, in one line.

The fresh-venv test installs from PyPI (pip's cache makes it about a minute): it is what `pip install .`
from a clone does, nothing of this checkout's own venv is used.
"""

from __future__ import annotations


def test_the_faces_name_what_outside_code_imports():
    import runledger.ledger
    import runledger.queries
    import runledger.training

    assert runledger.ledger.Emitter.__name__ == "Emitter"
    assert callable(runledger.training.capacities) and callable(runledger.training.forecast)
    assert runledger.training.Curve.__name__ == "Curve"
    assert callable(runledger.queries.connect)
