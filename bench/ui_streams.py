"""What one wake of the dashboard's live streams costs with N pages watching one run: the shared read of
runledger.ui.streams (one `Reader.new_points` per wake per run, handed to every stream) against one read per
stream (what each stream did before issue 33), in one command:

    python -m bench.ui_streams [--streams 1,8,32,300] [--steps 2000] [--wakes 5]

For each N: the median wall time from the feed's wake to every stream holding its `stored` event, the
reads made per wake, and the median time of N reads of the same new points one after another.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from runledger.ledger.storage import positions, store
from runledger.ledger.emit.sink import ParquetSink
from runledger.ui.data import Reader
from runledger.ui.live import Feed
from runledger.ui.streams import Streams

RUN = "watched"
T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def step(k: int) -> dict:
    return {"loss": 4.0 - 1e-4 * k, "grad_norm": 1.0, "lr": 1e-3, "tokens": 1000, "step_time_s": 1.0}


def log_steps(root: Path, seqs, first: int, n: int) -> None:
    """Steps first..first+n-1 of the run (a producer of their own: each call starts a chain)."""
    rows: list = []
    sink = ParquetSink(root, RUN, f"worker-{first}", stream_seqs=seqs, rows=rows, flush_every=None)
    sink.emit_dicts("step", [step(k) for k in range(first, first + n)], list(range(first, first + n)),
                    T0 + timedelta(seconds=first))
    store.write_events(root, rows)


async def one_size(reader: Reader, root: Path, seqs, n: int, wakes: int, first: int) -> tuple[dict, int]:
    feed = Feed(reader, None)
    streams = Streams(reader, feed, limit=n)
    reads = []
    real = reader.new_points
    reader.new_points = lambda *a, **k: reads.append(a) or real(*a, **k)
    subs = [streams.open(RUN, 0) for _ in range(n)]
    for sub in subs:
        await sub.next(1.0)  # the status event
    shared, per_stream = [], []
    try:
        for _ in range(wakes):
            since = reader.position_of(RUN)
            log_steps(root, seqs, first, 1)
            first += 1
            positions.write_position(root, since + 1)
            del reads[:]
            t0 = time.perf_counter()
            await feed.moved()
            for sub in subs:
                while (event := await sub.next(30.0)) is not None and event["event"] != "stored":
                    pass
            shared.append(time.perf_counter() - t0)
            made = len(reads)
            t0 = time.perf_counter()
            for _ in range(n):
                real(RUN, since)
            per_stream.append(time.perf_counter() - t0)
    finally:
        reader.new_points = real
        for sub in subs:
            sub.close()
        await streams.stop()
    return {"streams": n, "shared_wake_s": round(statistics.median(shared), 4), "reads_per_wake": made,
            "one_read_per_stream_s": round(statistics.median(per_stream), 4),
            "ratio": round(statistics.median(per_stream) / statistics.median(shared), 1)}, first


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="1,8,32,300")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--wakes", type=int, default=5)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-ui-streams-") as tmp:
        root = Path(tmp) / "root"
        seqs = itertools.count(1)
        log_steps(root, seqs, 0, args.steps)
        positions.write_position(root, args.steps)
        reader = Reader(root, threads=2)
        try:
            first, out = args.steps, []
            for n in (int(x) for x in args.streams.split(",")):
                got, first = asyncio.run(one_size(reader, root, seqs, n, args.wakes, first))
                out.append(got)
        finally:
            reader.close()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
