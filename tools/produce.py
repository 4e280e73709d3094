"""A synthetic producer for tests, chaos runs and benches: N `step` events through a real Emitter.

    python -m runledger.tools.produce --nats URL --spool DIR --run-id R --producer P [--count N] [--rate R]

Exits 0 once every event is acknowledged by JetStream (or leaves them in the spool if killed); run again on
the same spool, it goes on from the steps the chain holds (`steps_spooled`).
"""

from __future__ import annotations

import argparse
import logging
import time

import orjson

from runledger.ledger import redact
from runledger.ledger.emit.emitter import Emitter
from runledger.ledger.contract.events import StepCompleted


def step_payload(i: int) -> dict:
    return {"loss": 10.0 / (1 + i * 1e-3), "grad_norm": 1.0 + (i % 7) * 0.01, "lr": 3e-4, "tokens": 8192,
            "step_time_s": 0.05, "mfu": 0.31, "tokens_per_s": 163840.0}


def steps_spooled(em: Emitter) -> int:
    """The step a reopened chain goes on from: one past its last `step` event (the producer emits steps 0, 1, ...
    in order; the signed chain heads among them take seqs too, so the next seq is not it). Read from the newest
    segment back: the spool lets go of acknowledged segments, but never of its last one."""
    for seg in reversed(em.spool.segments()):
        for line in reversed(seg.read_bytes().splitlines()):
            try:
                env = orjson.loads(line)
            except orjson.JSONDecodeError:  # (a torn last line: set aside when the chain reopened)
                continue
            if isinstance(env, dict) and env.get("kind") == "step":
                return int(env["step"]) + 1
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nats", required=True)
    p.add_argument("--spool", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--producer", default="worker-0")
    p.add_argument("--attempt", type=int, default=0)
    p.add_argument("--count", type=int, default=10_000)
    p.add_argument("--rate", type=float, default=0, help="events/s (0: as fast as possible)")
    p.add_argument("--no-batch", action="store_true", help="one event per NATS message")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    redact.install()
    em = Emitter(args.run_id, args.producer, args.attempt, args.nats, args.spool, batch=not args.no_batch)
    start = time.monotonic()
    first = steps_spooled(em)
    for i in range(first, args.count):
        em.emit(StepCompleted(**step_payload(i)), step=i)
        if args.rate and i % 100 == 0:
            ahead = (i - first) / args.rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
    ok = em.close(timeout=300)
    logging.info("produced %d events (%d this process) in %.2fs, all acknowledged: %s",
                 args.count, args.count - first, time.monotonic() - start, ok)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
