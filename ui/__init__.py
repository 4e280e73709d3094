"""The live dashboard (`runledger ui`): a Starlette app over the ledger's read-only SQL views, pushed by server-sent events."""
