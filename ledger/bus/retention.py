"""What the RUNLEDGER stream may let go: the messages every durable consumer of the root has acked.

DESIGN.md: nothing is evicted before the ledger committed it and every durable consumer acked it;
then the tables are the record and the stream's copy may go. The stream keeps LIMITS retention
(interest-based retention drops a message at once when no consumer exists yet, and when a consumer
is deleted, as the ledger does to rewind one), and the ledger prunes it instead (`prune`, after its
commits and while idle): a purge with `seq` = `keep_from`, the lowest ack floor over every durable
consumer of the stream, plus one. A durable that exists but is stopped (a notify started late) holds
its messages until it acks them. The stream's last message is always kept: a purge by anyone else
then always moves its first seq past where the ledger's own last prune left it, which the ledger's
watch reports (service.stream_problem's `pruned_to`). A stream sourced by a partitioned ledger's derived stream (RUNLEDGER_P{K}) is not
pruned: its source is no durable consumer, and the seq it has read up to is not shown.
"""

from __future__ import annotations

import json
import logging

from runledger.ledger.contract.events import STREAM

log = logging.getLogger(__name__)

PRUNE_EVERY_S = 2.0  # the ledger prunes at most this often (after a commit, or while idle)


async def durable_consumers(js, stream: str = STREAM) -> list:
    """The ConsumerInfo of every durable consumer of `stream` (ephemeral ones are nobody's record)."""
    out, offset = [], 0
    while True:
        page = await js.consumers_info(stream, offset=offset)
        out += [c for c in page if c.config.durable_name]
        if len(page) < 256:  # (the server's page)
            return out
        offset += len(page)


def consumer_floor(info, last_seq: int) -> int:
    """The stream seq up to which consumer `info` has acked every message it will ever be given:
    its ack floor, or `last_seq` (the stream's end read before `info`) when nothing is pending or
    unacked (a filtered consumer's floor stays at the last message it matched)."""
    if not info.num_pending and not info.num_ack_pending:
        return max(info.ack_floor.stream_seq, last_seq)
    return info.ack_floor.stream_seq


async def sourced(nc, stream: str = STREAM) -> bool:
    """Whether a partitioned ledger's derived stream (RUNLEDGER_P{K}) sources `stream`."""
    reply = await nc.request("$JS.API.STREAM.NAMES", b"{}", timeout=2.0)
    names = json.loads(reply.data).get("streams") or []
    return any(n.startswith(f"{stream}_P") for n in names)


async def keep_from(js, stream: str = STREAM) -> tuple[int, int]:
    """(first seq, the first seq a prune keeps): every message below the second is acked by every
    durable consumer, and the stream's last message is kept (the second may be below the first: then
    nothing is to let go). Raises if the server does not answer."""
    state = (await js.stream_info(stream)).state
    floors = [consumer_floor(c, state.last_seq) for c in await durable_consumers(js, stream)]
    return state.first_seq, min(min(floors, default=0) + 1, state.last_seq)  # (no durable at all: nothing goes)


async def prune(nc, js, stream: str = STREAM, not_past: int | None = None) -> tuple[int, int]:
    """Purge what every durable consumer of `stream` has acked (see the module docstring): (the number
    of messages let go, the seq the stream now begins at; 0, 0 when nothing went). `not_past`: the
    highest first seq the pruner left the stream at; a stream beginning past it was purged by someone
    else, and is left as it is for the pruner's watch to report (a prune now would hide it)."""
    first, keep = await keep_from(js, stream)
    if keep <= first or (not_past is not None and first > not_past) or await sourced(nc, stream):
        return 0, 0
    await js.purge_stream(stream, seq=keep)
    log.debug("stream %s: messages %d..%d acked by every durable consumer let go", stream, first, keep - 1)
    return keep - first, keep
