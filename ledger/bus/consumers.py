"""What every consumer of the stream does alike: bind with retries, rewind a dead one, answer chain status.

`subscribe_until_ready` connects and binds (retrying while the server is away or electing a leader);
`rewind_to_ack_floor` makes a consumer that a dead predecessor left holding unacked messages deliver
them again at once (the ledger, each partition's writer, notify); `serve_chain_status` answers the
producers' `{LEDGER_API}.chains.{run_id}.{producer}` for a ledger or a partition. `stream_seq` and
`consumer_seq` read a message's sequences off its ack subject.
"""

from __future__ import annotations

import asyncio
import json
import logging

from nats.js.api import DeliverPolicy

from runledger.ledger.bus.natsserver import LEDGER_API

log = logging.getLogger(__name__)

RETRY_S = 0.5  # how long between two tries to bind


async def subscribe_until_ready(connect, stop: asyncio.Event, bind, waiting: str,
                                fatal: tuple[type[BaseException], ...] = (), warn_every: int = 1):
    """`await connect()` and `bind(nc)` (returns what to consume with), waiting RETRY_S between tries while
    the server is not up or not ready, and logging `waiting` every `warn_every` tries. (nc, what `bind`
    returned), or (None, None) if `stop` came first. An exception of `fatal` goes up. `connect` must fail
    at once when no server answers (runledger.ledger.bus.jetstream.connect_listening): nats-py's first
    connect to none tries forever, deaf to a stop and to cancellation."""
    tries = 0
    while not stop.is_set():
        nc = None
        try:
            nc = await connect()
            return nc, await bind(nc)
        except fatal:
            if nc is not None:
                await nc.close()
            raise
        except Exception as err:
            if tries % warn_every == 0:
                log.warning("%s (%s)", waiting, str(err) or type(err).__name__)
            if nc is not None:
                await nc.close()
            tries += 1
            try:  # (a stop ends the wait at once)
                await asyncio.wait_for(stop.wait(), RETRY_S)
            except asyncio.TimeoutError:
                pass
    return None, None


async def rewind_to_ack_floor(js, stream: str, durable: str, info, cfg, what: str | None = None,
                              from_floor: bool = True) -> bool:
    """If consumer `durable` (its `info`) holds unacked messages, a previous consumer died with them:
    JetStream would redeliver them only after ack_wait. Make it again (`cfg`) from just past its ack
    floor instead (`from_floor=False`: delivering all, which a work-queue stream starts at the first
    message not acked), so that they come at once; whoever consumes dedupes what it had taken.
    `what` is the log line (else the consumer's). True if it was made again."""
    if not info.num_ack_pending:
        return False
    floor = info.ack_floor.stream_seq
    log.info(what or "consumer %s had %d unacked messages; rewinding to stream seq %d", durable,
             info.num_ack_pending, floor + 1)
    await js.delete_consumer(stream, durable)
    if from_floor:
        cfg.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
        cfg.opt_start_seq = floor + 1
    await js.add_consumer(stream, cfg)
    return True


async def serve_chain_status(nc, ack_floor, chain_status, mine=None) -> None:
    """Answer {LEDGER_API}.chains.{run_id}.{producer}: `await ack_floor()` (the stream seq up to which
    everything is stored) and `chain_status(run_id, producer)`; a run not `mine(run_id)` is left to
    another writer. When the floor cannot be had, no answer: better than a wrong one (the producer
    waits or gives up)."""

    async def answer(msg) -> None:
        parts = msg.subject.split(".")
        if len(parts) != 4 or not msg.reply or (mine is not None and not mine(parts[2])):
            return
        try:
            floor = await ack_floor()
        except Exception as err:
            log.debug("chain status: no stream or consumer info (%s)", err)
            return
        await msg.respond(json.dumps({"ack_floor": floor, **chain_status(parts[2], parts[3])}).encode())

    await nc.subscribe(f"{LEDGER_API}.chains.*.*", cb=answer)


def stream_seq(msg) -> int:
    """A JetStream message's stream sequence, from its ack subject: $JS.ACK.<stream>.<consumer>.
    <delivered>.<stream seq>... (9 tokens), or with <domain>.<account hash> after ACK (12 or more).
    nats-py's `msg.metadata` parses every field, a tenth of the ledger's time at one event per message."""
    tokens = msg.reply.split(".") if msg.reply else ()
    if len(tokens) == 9 and tokens[5].isdigit():
        return int(tokens[5])
    if len(tokens) >= 12 and tokens[7].isdigit():
        return int(tokens[7])
    return msg.metadata.sequence.stream


def consumer_seq(msg) -> int | None:
    """A JetStream message's consumer sequence (its delivery count on the consumer, which a consumer
    made anew starts again at 1), from its ack subject (see `stream_seq`); None if it has none."""
    tokens = msg.reply.split(".") if msg.reply else ()
    if len(tokens) == 9 and tokens[6].isdigit():
        return int(tokens[6])
    if len(tokens) >= 12 and tokens[8].isdigit():
        return int(tokens[8])
    return None


def pending_after(msg) -> int | None:
    """Messages still pending on the consumer when `msg` was delivered (its ack subject's last token)."""
    tokens = msg.reply.split(".") if msg.reply else ()
    return int(tokens[-1]) if tokens and tokens[-1].isdigit() else None
