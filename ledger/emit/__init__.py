"""The producer's side: sinks (sink), sealing events into a chain (sealing), the chain's outbox on
disk (spool), its publisher thread (publisher), the NATS producer (emitter), attempts and chain
status (chains), and `runledger publish` (publish)."""
