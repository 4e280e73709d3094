"""NATS JetStream: connecting, the RUNLEDGER stream and durable pull consumers (jetstream), and a
local nats-server with its roles (natsserver)."""
