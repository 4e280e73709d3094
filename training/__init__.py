"""training: a small Marin-shaped MoE in JAX that trains on CPU and records its run through the ledger.

config (presets), model + moe (router, capacity and dropless dispatch), data (domains, provenance),
schedule (lr and its retime), checkpoint (orbax), flops (MFU), worker (train step and loop),
decisions (what the worker does with one), cli (`runledger train`).
"""
