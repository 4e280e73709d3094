"""One instance of a partitioned ledger: it writes the partitions whose leases it holds (a writer each,
runledger.ledger.ingest.partitions.writer) and stands by for the others, taking over a partition whose
writer died and handing over those past its share (runledger.ledger.ingest.partitions.leases)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from runledger.ledger.ingest.partitions.leases import POLL_S, Leases, instance_id
from runledger.ledger.ingest.partitions.parts import Part
from runledger.ledger.ingest.partitions.root import SharedRoot, catalog_of, open_tables, use_catalog
from runledger.ledger.ingest.partitions.stream import ensure_parts_stream
from runledger.ledger.ingest.partitions.writer import write_partition
from runledger.ledger.storage.positions import read_position

log = logging.getLogger(__name__)


async def serve(root: str | Path, nats_url: str, k: int, stop: asyncio.Event | None = None,
                batch: int | None = None, catalog: str | None = None) -> dict[int, int]:
    """One instance of a ledger served in `k` partitions: it writes the partitions whose leases it
    holds and stands by for the others, until `stop` (SIGTERM/SIGINT when None); returns the events
    it stored per partition. Raises locks.Busy if a single ledger serves the root, or it is served in
    another number of partitions; service.StreamLost if a writer found RUNLEDGER or the derived stream
    purged or made anew (every writer stops)."""
    from runledger.ledger.bus import jetstream as bus
    from runledger.ledger.ingest import service

    root = Path(root)
    if service.halted(root):
        raise service.StreamLost(f"{service.halted(root)} (recorded in {root / service.HALTED}; this root is not "
                                 f"served again)")
    stop = stop or service.stopped_by_signals()  # (first: a SIGTERM while the root opens stops it cleanly)
    shared = SharedRoot(root, k)
    lost = None  # a writer's StreamLost: every writer stops, and so does this instance
    try:
        catalog = catalog or catalog_of(root)
        if catalog:
            use_catalog(root, catalog)
        open_tables(root)  # a warm standby: the catalog opened (and pyiceberg imported) before any takeover
        while not stop.is_set():  # the streams first (a cluster may still be electing its leader)
            try:
                nc = await bus.connect_listening(nats_url, name="ledger")
                try:
                    js = nc.jetstream()
                    await bus.ensure_stream(js)
                    await ensure_parts_stream(js, k, start_seq=read_position(root))
                finally:
                    await nc.close()
                break
            except Exception as err:
                log.warning("waiting for NATS at %s (%s)", nats_url, str(err) or type(err).__name__)
                with contextlib.suppress(asyncio.TimeoutError):  # (a stop ends the wait at once)
                    await asyncio.wait_for(stop.wait(), 0.5)
        leases = Leases(nats_url, k, instance_id()).start()
        log.info("ledger instance %s serving %s in %d partitions", leases.instance, root, k)
        writers: dict[int, tuple[asyncio.Task, asyncio.Event]] = {}
        stored: dict[int, int] = {}
        while not stop.is_set():
            if leases.error is not None:
                raise RuntimeError(f"the lease thread stopped: {leases.error}")
            for p in range(k):
                if p not in writers and leases.holds(p) and not leases.handing_over(p):
                    ended = asyncio.Event()
                    writers[p] = (asyncio.create_task(write_partition(root, nats_url, Part(k, p), leases, ended, batch or service.FETCH_BATCH)), ended)
            for p, (task, ended) in list(writers.items()):
                if not leases.holds(p) or leases.handing_over(p):
                    ended.set()
                if task.done():
                    del writers[p]
                    if leases.handing_over(p):
                        leases.release(p)
                    if not task.cancelled() and isinstance(task.exception(), service.StreamLost):
                        lost = task.exception()
                        stop.set()
                    elif not task.cancelled() and task.exception() is not None:
                        log.error("partition %d: writer failed: %s", p, task.exception())
                    elif not task.cancelled():
                        stored[p] = stored.get(p, 0) + task.result()
            try:
                await asyncio.wait_for(stop.wait(), POLL_S)
            except asyncio.TimeoutError:
                pass
        for _, ended in writers.values():
            ended.set()
        for p, result in zip(writers, await asyncio.gather(*(t for t, _ in writers.values()), return_exceptions=True)):
            if isinstance(result, int):
                stored[p] = stored.get(p, 0) + result
            elif isinstance(result, service.StreamLost):
                lost = result
        leases.stop()
        log.info("ledger instance %s stopped", leases.instance)
        if lost is not None:
            raise lost
        return stored
    finally:
        shared.release()
