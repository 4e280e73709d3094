"""The derived stream RUNLEDGER_P{K} (RUNLEDGER's events by partition, work-queue) and each partition's consumer on it."""

from __future__ import annotations

import logging

from runledger.ledger.contract.events import STREAM, SUBJECT_PREFIX
from runledger.ledger.ingest.partitions.parts import Part, parts_prefix, parts_stream

log = logging.getLogger(__name__)


async def ensure_parts_stream(js, k: int, start_seq: int = 0) -> None:
    """The derived stream of `k` partitions (see runledger.ledger.ingest.partitions); made once, sourcing RUNLEDGER
    from `start_seq` + 1 (what a root's single ledger took before is not sourced again)."""
    from nats.js.errors import BadRequestError, NotFoundError

    name = parts_stream(k)
    try:
        await js.stream_info(name)
        return
    except NotFoundError:
        pass
    replicas = (await js.stream_info(STREAM)).config.num_replicas or 1
    try:
        await js.add_stream(parts_stream_config(k, start_seq, replicas))
    except BadRequestError:  # made meanwhile by another instance
        pass


def parts_stream_config(k: int, start_seq: int = 0, replicas: int = 1, sourcing: bool = True):
    """The derived stream's configuration (`sourcing=False`: not fed yet, for a bench's start)."""
    from nats.js.api import RetentionPolicy, StorageType, StreamConfig, StreamSource, SubjectTransform

    prefix = parts_prefix(k)
    source = StreamSource(name=STREAM, opt_start_seq=start_seq + 1 if start_seq else None, subject_transforms=[
        SubjectTransform(src=f"{SUBJECT_PREFIX}.*.>", dest=f"{prefix}.{{{{partition({k},1)}}}}.{{{{wildcard(1)}}}}.>"),
        # a subject of two tokens is no event's: partition 0 quarantines it, as one ledger would
        SubjectTransform(src=f"{SUBJECT_PREFIX}.*", dest=f"{prefix}.0.{{{{wildcard(1)}}}}"),
    ])
    return StreamConfig(name=parts_stream(k), subjects=[], retention=RetentionPolicy.WORK_QUEUE, storage=StorageType.FILE,
                        sources=[source] if sourcing else None, num_replicas=replicas)


def part_consumer_problem(info, part: Part) -> str | None:
    """Why a partition's consumer is not as ensure_part_consumer made it (re-created by someone else to
    deliver only what comes next, say, which on a work-queue stream leaves the rest untaken), or None."""
    cfg = info.config
    deliver, ack = (getattr(v, "value", v) for v in (cfg.deliver_policy, cfg.ack_policy))
    if deliver != "all":
        return f"delivers from {deliver!r}, not from the first message not acked"
    if cfg.filter_subject != part.filter:
        return f"takes {cfg.filter_subject or cfg.filter_subjects}, not partition {part.p}'s {part.filter}"
    if ack != "explicit":
        return f"has ack policy {ack!r}, not explicit"
    return None


async def ensure_part_consumer(js, part: Part) -> None:
    """The partition's durable pull consumer; what a dead writer left unacked is delivered at once (the
    consumer is made anew: on a work-queue stream it starts at the first message not acked)."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
    from nats.js.errors import NotFoundError

    from runledger.ledger.bus.consumers import rewind_to_ack_floor
    from runledger.ledger.bus.jetstream import ACK_WAIT_S, MAX_ACK_PENDING

    stream = parts_stream(part.k)
    cfg = ConsumerConfig(durable_name=part.durable, deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.EXPLICIT,
                         ack_wait=ACK_WAIT_S, max_deliver=-1, max_ack_pending=MAX_ACK_PENDING, filter_subject=part.filter)
    try:
        info = await js.consumer_info(stream, part.durable)
    except NotFoundError:
        await js.add_consumer(stream, cfg)
        return
    await rewind_to_ack_floor(js, stream, part.durable, info, cfg, from_floor=False,
                              what="consumer %s: %d messages left unacked by the last writer; delivering them again "
                                   "now (from its first not acked, after seq %d)")


async def partition_figures(js, part: Part) -> dict:
    """Live figures from NATS: the partition's backlog (messages not yet acked)."""
    info = await js.consumer_info(parts_stream(part.k), part.durable)
    return {"pending": info.num_pending + info.num_ack_pending, "ack_pending": info.num_ack_pending}
