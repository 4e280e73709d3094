"""A partition's writer: the ledger service's loop (runledger.ledger.ingest.service) on one partition,
while this instance holds its lease.

A new writer starts like a restarted ledger, on its partition only: it removes its own runs' half
written files (`Part.recover`), loads what is stored, and makes its consumer deliver at once what its
predecessor left unacked. It answers the producers' chain status for its partition's runs, and keeps
its partition's status record (runledger.ledger.ingest.partitions.status).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from runledger.ledger.contract.events import STREAM
from runledger.ledger.ingest.partitions.leases import Leases
from runledger.ledger.ingest.partitions.parts import Part, parts_stream
from runledger.ledger.ingest.partitions.status import record_takeover, report_status
from runledger.ledger.ingest.partitions.stream import ensure_part_consumer, part_consumer_problem

log = logging.getLogger(__name__)


async def write_partition(root: Path, nats_url: str, part: Part, leases: Leases, ended: asyncio.Event, batch: int) -> int:
    """Write partition `part` while this instance holds its lease (until `ended`); returns the events stored."""
    from runledger.ledger.bus import consumers
    from runledger.ledger.bus import jetstream as bus
    from runledger.ledger.bus.jetstream import Puller
    from runledger.ledger.ingest import service

    ledger = service.Ledger(root, part, fence=lambda: leases.holds(part.p))

    async def subscribe(url, stop, ledger):
        async def bind(nc):
            js = nc.jetstream()
            await service.bind_stream(js, ledger)  # (the stream its tables were fed by, or refused)
            await ensure_part_consumer(js, part)
            await consumers.serve_chain_status(nc, lambda: chains_floor(ledger, part, js), ledger.chain_status,
                                               mine=part.has)
            puller = await Puller(nc, parts_stream(part.k), part.durable).start()
            record_takeover(root, part, leases)
            return puller

        return await consumers.subscribe_until_ready(lambda: bus.connect_listening(url, name=f"ledger-p{part.p}"), stop, bind,
                                                     f"partition {part.p}: waiting for NATS")

    def watch(js) -> service.Watch:  # the partition's consumer on the derived stream, and both streams
        return service.Watch(js, ledger, part.durable, consumer_stream=parts_stream(part.k),
                             consumer_problem=lambda info: part_consumer_problem(info, part),
                             streams=(parts_stream(part.k),))

    async def remake(js) -> None:  # (deleted: `subscribe` makes it again, from the first message not acked)
        from nats.js.errors import NotFoundError

        try:
            await js.delete_consumer(parts_stream(part.k), part.durable)
        except NotFoundError:
            pass

    reporter = asyncio.create_task(report_status(root, part, leases, ledger, ended))
    try:
        await service.serve_ledger(ledger, nats_url, ended, batch, subscribe=subscribe, watch=watch, remake=remake)
    finally:
        ended.set()
        await reporter
    log.info("partition %d: writer stopped (%s)", part.p, ledger.counters.line())
    return ledger.counters.stored


async def chains_floor(ledger, part: Part, js) -> int:
    """The ack floor of the chain status (runledger.ledger.bus.consumers.serve_chain_status) for this
    partition's runs. It is RUNLEDGER's: every message of this partition up to it is stored; when nothing
    of the partition is pending and its source has caught up, that is RUNLEDGER's last seq as read first."""
    last = (await js.stream_info(STREAM)).state.last_seq
    info = await js.consumer_info(parts_stream(part.k), part.durable)
    lag = (await js.stream_info(parts_stream(part.k))).sources[0].lag
    idle = not info.num_pending and not info.num_ack_pending and not lag
    return max(ledger.taken_upto, last) if idle else ledger.taken_upto
