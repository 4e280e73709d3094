"""Where people already train, recorded in the ledger: each integration is a module of its own that imports its
framework only when it is imported, and records through the public logging API (`runledger.init`, `Run.log`,
`run.config.update`, `Run.log_checkpoint`, `Run.finish`), as `runledger.levanter` does for Levanter.

    from runledger.integrations.hf import RunledgerCallback         # transformers' Trainer: callbacks=[...]
    from runledger.integrations.lightning import RunledgerLogger    # Lightning's Trainer: logger=...
    from runledger.integrations.keras import RunledgerCallback      # Keras 3's fit: callbacks=[...]

What each records: docs/integrations.md. None needs more than its framework (and runledger's base install).
"""
