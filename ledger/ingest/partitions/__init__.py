"""Partitioned ingest: K ledger partitions by run, each with one writer at a time, held by a lease in JetStream KV.

`runledger ledger serve --partitions K` runs one instance; several instances (on one machine or on
several sharing the root) share the K partitions, and a standby takes a partition over when its
writer dies.

How events are partitioned. The stream RUNLEDGER stays as it is: the record, whose subjects
(`runledger.RUN.KIND`) the agents, notify and the UI filter on. A derived stream `RUNLEDGER_P{K}`
sources it through NATS's deterministic subject mapping `partition(K, 1)` on the run token, storing
each message as `runledger-p{K}.{partition}.{run}.{kind}`; partition p's durable consumer
`ledger-p{p}` filters `runledger-p{K}.{p}.>`. (Transforming RUNLEDGER's own subjects would break
every consumer that filters `runledger.*.decision`; K filtered consumers on RUNLEDGER cannot
express a hash of the run.) The derived stream has work-queue retention: a message is deleted
when its partition's writer acks it, so it holds the backlog, not a second copy. Each message keeps
its RUNLEDGER sequence and subject in the `Nats-Stream-Source` header (`origin`): the rows' `stream_seq` is
RUNLEDGER's, as with one ledger. A run's events all go to one partition, so its chains and its
dedupe stay inside that partition.

Who writes a partition. A lease in the KV bucket `runledger-leases-k{K}` (key `p{p}`, the holder
in the value; the bucket's TTL LEASE_TTL_S): `create` takes a free lease, `update(..., last=revision)`
renews it every RENEW_EVERY_S, and a lease its holder stops renewing expires, for a standby's
`create` to take. nats-py 2.16 has no API for a consumer's pinned-client priority group, so the
lease is the mechanism NATS offers here. Leases are renewed by a thread with its own connection
and loop, so a long commit in the writer does not let its lease lapse. A writer fences itself: it
commits only while its last renewal is less than LEASE_TTL_S - FENCE_MARGIN_S old (Ledger.commit
asks `holds`), and stops when it is not. What a lease cannot fence is a writer frozen (SIGSTOP,
swapped out) between that check and the catalog commit for longer than FENCE_MARGIN_S: the
Iceberg catalog has no fencing token.

A new writer starts like a restarted ledger, on its partition only: it deletes the temp and
uncommitted files of its own runs (never another partition's, which may be in flight), loads what
is stored (the tables' current snapshot: everything its predecessor committed), and makes its
consumer deliver at once what its predecessor left unacked. Positions are per partition
(`{root}/partitions/k{K}-p{p}.position`). Status records (`{root}/partitions/k{K}-p{p}.json`: the
writer, since when, its last commit and snapshot, the backlog as of its last fetch, and each
takeover with the time the partition was without a writer) are what `runledger status` and the
UI read.

Known limits: ledger snapshot numbers (`--snapshot N`) are counted by each instance, so with several
writers they do not name one cut across the tables (reading the current snapshots is exact); every
instance of a root must be started with the same K (recorded in `{root}/partitions/layout.json`).

The modules, by concept: `parts` (a partition: its runs, consumer, files; the writer's Position),
`stream` (the derived stream and the partitions' consumers), `leases` (who writes which partition,
and balancing), `root` (the shared root, its layout and catalog), `writer` (a partition's writer),
`status` (its status record and takeovers), `instance` (one instance's loop), `figures` (the
operators' view). How far a run is stored is runledger.ledger.storage.stored's.
"""

from runledger.ledger.ingest.partitions.figures import figures
from runledger.ledger.ingest.partitions.instance import serve
from runledger.ledger.ingest.partitions.leases import FENCE_MARGIN_S, LEASE_TTL_S, RENEW_EVERY_S, Leases
from runledger.ledger.ingest.partitions.parts import Part, origin, parts_stream
from runledger.ledger.ingest.partitions.root import catalog_of, layout, open_tables, use_catalog
from runledger.ledger.ingest.partitions.stream import ensure_part_consumer, partition_figures, parts_stream_config
from runledger.ledger.storage.stored import partition_of, positions, stored_upto

__all__ = ["FENCE_MARGIN_S", "LEASE_TTL_S", "RENEW_EVERY_S", "Leases", "Part", "catalog_of", "ensure_part_consumer",
           "figures", "layout", "open_tables", "origin", "partition_figures", "partition_of", "parts_stream",
           "parts_stream_config", "positions", "serve", "stored_upto", "use_catalog"]
