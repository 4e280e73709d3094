"""training: a small Marin-shaped MoE in JAX that trains on CPU and records its run through the ledger.

config (presets), model + moe (router, capacity and dropless dispatch), data (domains, provenance),
schedule (lr and its retime), checkpoint (orbax), flops (MFU), worker (train step and loop),
decisions (what the worker does with one), cli (`runledger train`).

`capacities` (moe), `Curve` and `forecast` (the ladder's fit, ladder_fit) are its face, loaded on use.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """The face, loaded on first use (JAX and scipy load only where they are needed)."""
    if name == "capacities":
        from runledger.training.moe import capacities

        return capacities
    if name in ("Curve", "forecast"):
        from runledger.training import ladder_fit

        return getattr(ladder_fit, name)
    raise AttributeError(f"module 'runledger.training' has no attribute {name!r}")
