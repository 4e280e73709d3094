"""The faces outside code imports: `runledger.ledger`, `runledger.queries` and `runledger.training`
(whose `capacities` loads JAX: so here, not in tests/unit, which refuses JAX)."""

from __future__ import annotations


def test_the_faces_name_what_outside_code_imports():
    import runledger.ledger
    import runledger.queries
    import runledger.training

    assert runledger.ledger.Emitter.__name__ == "Emitter"
    assert callable(runledger.training.capacities) and callable(runledger.training.forecast)
    assert runledger.training.Curve.__name__ == "Curve"
    assert callable(runledger.queries.connect)
