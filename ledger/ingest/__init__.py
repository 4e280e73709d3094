"""The ledger service: the loop from JetStream to the tables (service), the batch check (batch), and
partitioned ingest (partitions)."""
