"""Ingest throughput, end to end, against raw nats-py and pyarrow alone, in one command.

    python -m bench.ingest [--events N]

Each path runs as two processes (producer, consumer) on this machine, with a fresh nats-server:
  e2e      Emitter.emit(StepCompleted(...)) → spool → NATS → ledger (validate, dedupe, Parquet, fsync) → ack
  raw      nats-py publish_async + pull fetch + ack of the same bytes, no validation, no writing
  pyarrow  the ledger's Parquet writer alone on the same rows (one process)
both with one event per NATS message and with the Emitter's batching (many events per message);
the emit_many row hands the Emitter --many typed events per call (Emitter.emit_many), as a high-rate
producer can, and the emit_dicts row --many payload dicts of one kind (Emitter.emit_dicts: input
that arrives as JSON; the CPU per event of batch sealing alone, without building models). The
drain row: --backlog events already in the stream when the ledger starts (a ledger catching up
after a restart).
The partition rows (`--partitions 1,2`: alone) drain one backlog of --backlog events over 4 runs
with K instances of `ledger serve` (K = 1: the single ledger as it runs by default; K > 1: one
instance per partition, `--partitions K`, leases and all), each a process of its own: events/s, each
instance's CPU µs per event it stored, and its commits' ack wait. On 2 cores the sum cannot double;
what should hold is that CPU per event per instance does not grow with K.
Ratios are against the raw path in the same mode, run in the same command; the last line compares
runledger as it runs (batching when a backlog forms) with raw nats-py as one would use it without
runledger (one message per event). The CPU columns are each process's user + system seconds per
event: on 2 cores, with nats-server beside them, their sum bounds the end-to-end rate.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import resource
import shutil
import tempfile
import time
from pathlib import Path

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.ingest import service
from runledger.ledger.storage import compaction, store
from runledger.ledger.storage.rows import StoredEvent
from runledger.ledger.contract.canonical import canonical_json
from runledger.ledger.emit.emitter import Emitter
from runledger.ledger.contract.events import STREAM, StepCompleted, subject_for
from runledger.ledger.bus.natsserver import NatsServer
from runledger.ledger.emit.publisher import MAX_BATCH_EVENTS
from runledger.ledger.emit.sealing import seal
from runledger.tools.produce import step_payload


def make_events(n: int, run_id: str = "bench") -> list[tuple[dict, str]]:
    out, prev = [], ""
    for i in range(n):
        env, text = seal(run_id, "worker-0", 0, i, "step", step_payload(i), i, prev)
        prev = env["hash"]
        out.append((env, text))
    return out


# ------------------------------------------------------------------------------ e2e


def _e2e_producer(url: str, spool: str, n: int, batch: bool, many: int, typed: bool, q) -> None:
    em = Emitter("bench", "worker-0", 0, url, spool, batch=batch)
    t0, cpu0 = time.time(), _cpu_s()
    if many > 1 and typed:  # a high-rate producer handing over `many` typed events at a time
        for i in range(0, n, many):
            k = min(many, n - i)
            em.emit_many([StepCompleted(**step_payload(j)) for j in range(i, i + k)], steps=list(range(i, i + k)))
    elif many > 1:  # ... or `many` payload dicts of one kind (input that arrives as JSON)
        for i in range(0, n, many):
            k = min(many, n - i)
            em.emit_dicts("step", [step_payload(j) for j in range(i, i + k)], steps=list(range(i, i + k)))
    else:  # a producer's typed events, one at a time
        for i in range(n):
            em.emit(StepCompleted(**step_payload(i)), step=i)
    emitted = time.time()
    em.close(600)
    q.put(("producer", t0, emitted, time.time(), _cpu_s() - cpu0))


def _e2e_ledger(url: str, root: str, n: int, q) -> None:
    cpu0 = _cpu_s()
    counters = asyncio.run(service.serve(root, url, stop=asyncio.Event(), until_stored=n))
    t_end, cpu = time.time(), _cpu_s() - cpu0
    compaction.compact(Path(root))  # what the ledger does next, when idle (counted apart)
    q.put(("ledger", t_end, counters.stored, counters.messages, cpu, time.time() - t_end, list(counters.ack_waits)))


def _cpu_s() -> float:
    """CPU seconds (user + system) this process has used."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _collect(q, *procs: mp.Process) -> dict:
    """Each process's report (a tuple named by its first item), then wait for them to exit."""
    results = {}
    for _ in procs:
        r = q.get(timeout=900)
        results[r[0]] = r
    for p in procs:
        p.join()
    return results


def run_e2e(url: str, tmp: Path, n: int, batch: bool, many: int = 1, typed: bool = True) -> dict:
    q = mp.Queue()
    ledger = mp.Process(target=_e2e_ledger, args=(url, str(tmp / "root"), n, q))
    ledger.start()
    time.sleep(1.0)  # the ledger is connected and waiting
    producer = mp.Process(target=_e2e_producer, args=(url, str(tmp / "spool"), n, batch, many, typed, q))
    producer.start()
    results = _collect(q, producer, ledger)
    _, t0, emitted, _, producer_cpu = results["producer"]
    _, t_end, stored, messages, ledger_cpu, compact_s, waits = results["ledger"]
    assert stored == n, f"stored {stored} of {n}"
    waits.sort()
    return {"events_per_s": n / (t_end - t0), "emit_per_s": n / (emitted - t0), "messages": messages,
            "producer_us": producer_cpu / n * 1e6, "ledger_us": ledger_cpu / n * 1e6, "compact_s": compact_s,
            "with_compaction_per_s": n / (t_end - t0 + compact_s), "commits": len(waits),
            "ack_wait_ms": (waits[len(waits) // 2] * 1e3, waits[int(len(waits) * 0.99)] * 1e3, waits[-1] * 1e3)}


def _drain_ledger(url: str, root: str, n: int, q) -> None:
    t0, cpu0 = time.time(), _cpu_s()
    counters = asyncio.run(service.serve(root, url, stop=asyncio.Event(), until_stored=n))
    q.put(("ledger", time.time() - t0, _cpu_s() - cpu0, counters.stored))


def run_drain(url: str, tmp: Path, n: int, many: int) -> dict:
    """A backlog: `n` events emitted (emit_dicts) with no ledger running, then the ledger started."""
    em = Emitter("bench", "worker-0", 0, url, tmp / "spool")
    for i in range(0, n, many):
        k = min(many, n - i)
        em.emit_dicts("step", [step_payload(j) for j in range(i, i + k)], steps=list(range(i, i + k)))
    assert em.close(600)
    q = mp.Queue()
    ledger = mp.Process(target=_drain_ledger, args=(url, str(tmp / "root"), n, q))
    ledger.start()
    _, wall, cpu, stored = _collect(q, ledger)["ledger"]
    assert stored == n, f"stored {stored} of {n}"
    return {"events_per_s": n / wall, "ledger_us": cpu / n * 1e6}


# ------------------------------------------------------------------------------ K partitions


def _runs_over(k: int, runs: int = 4) -> list[str]:
    """`runs` run ids spread evenly over `k` partitions (and over 2, for the K = 2 row)."""
    from runledger.ledger.ingest.partitions import partition_of

    out, i = [], 0
    while len(out) < runs:
        name = f"bench-{i}"
        if sum(partition_of(r, max(k, 2)) == partition_of(name, max(k, 2)) for r in out) < runs // max(k, 2):
            out.append(name)
        i += 1
    return out


def _instance(url: str, root: str, k: int, go, clock, q) -> None:
    """One `ledger serve` instance (K = 1: the single ledger), from `go` until SIGTERM; its CPU is
    counted from `clock` (when the backlog is let in)."""
    import signal
    import threading

    from runledger.ledger.ingest import partitions

    partitions.open_tables(Path(root))  # (imports done before the clock starts)
    go.wait()
    started = [_cpu_s()]

    def at_clock() -> None:
        clock.wait()
        started[0] = _cpu_s()

    threading.Thread(target=at_clock, daemon=True).start()
    if k == 1:
        stop = asyncio.Event()

        async def serve():
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
            return await service.serve(root, url, stop=stop)

        counters = asyncio.run(serve())
        waits = sorted(counters.commit_s)
        q.put(("instance", _cpu_s() - started[0], counters.stored, waits[len(waits) // 2] * 1e3 if waits else None))
    else:
        stored = asyncio.run(partitions.serve(root, url, k))
        q.put(("instance", _cpu_s() - started[0], sum(stored.values()), None))


async def _backlog_left(url: str, k: int) -> int:
    from runledger.ledger.ingest import partitions

    nc = await bus.connect(url)
    try:
        js = nc.jetstream()
        if k == 1:
            info = await js.consumer_info(STREAM, service.DURABLE)
            return info.num_pending + info.num_ack_pending
        left = 0
        for p in range(k):
            left += (await partitions.partition_figures(js, partitions.Part(k, p)))["pending"]
        return left
    finally:
        await nc.close()


def run_partitions(url: str, tmp: Path, n: int, k: int, many: int) -> dict:
    """A backlog of `n` events over 4 runs, drained by `k` instances (see the module's docstring)."""
    import os

    from runledger.ledger.ingest import partitions

    runs = _runs_over(k)
    for run in runs:
        em = Emitter(run, "worker-0", 0, url, tmp / "spool")
        per = n // len(runs)
        for i in range(0, per, many):
            em.emit_dicts("step", [step_payload(j) for j in range(i, min(per, i + many))], steps=list(range(i, min(per, i + many))))
        assert em.close(600)
    root = tmp / "root"
    if k > 1:  # the derived stream made, not fed yet, and its consumers (see _feed_partitions)
        asyncio.run(_prepare_partitions(url, k))
    q, go, clock = mp.Queue(), mp.Event(), mp.Event()
    procs = [mp.Process(target=_instance, args=(url, str(root), k, go, clock, q)) for _ in range(k)]
    for p in procs:
        p.start()
    if k > 1:
        go.set()
        _wait_balanced(root, k)
    else:
        time.sleep(3.0)  # the instance has imported what it needs
    load = os.getloadavg()[0]
    t0 = time.time()
    clock.set()
    if k > 1:
        asyncio.run(_feed_partitions(url, k))
    else:
        go.set()
    time.sleep(0.5)
    while asyncio.run(_backlog_left(url, k)) > 0:
        time.sleep(0.05)
    wall = time.time() - t0
    for p in procs:
        p.terminate()  # SIGTERM: each drains and reports
    reports = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join()
    stored = [r[2] for r in reports]
    cpus = [r[1] for r in reports]
    if k == 1:
        waits = [reports[0][3] and round(reports[0][3], 1)]
    else:
        waits = [partitions.Part(k, p).read_status(root).get("commit_ms", {}).get("median") for p in range(k)]
    total = sum(stored)
    assert total == n - n % len(runs), f"stored {total} of {n}"
    return {"k": k, "events_per_s": total / wall, "wall_s": wall, "load": load,
            "cpu_us": [c / max(s, 1) * 1e6 for c, s in zip(cpus, stored)], "stored": stored, "ack_wait_ms": waits}


async def _prepare_partitions(url: str, k: int) -> None:
    """The derived stream without its source (the instances find it made), and its consumers."""
    from runledger.ledger.ingest import partitions

    nc = await bus.connect(url)
    js = nc.jetstream()
    await js.add_stream(partitions.parts_stream_config(k, sourcing=False))
    for p in range(k):
        await partitions.ensure_part_consumer(js, partitions.Part(k, p))
    await nc.close()


async def _feed_partitions(url: str, k: int) -> None:
    """The clock starts: the derived stream sources the backlog (the server's sourcing is measured too)."""
    from runledger.ledger.ingest import partitions

    nc = await bus.connect(url)
    await nc.jetstream().update_stream(partitions.parts_stream_config(k))
    await nc.close()


def _wait_balanced(root: Path, k: int, timeout: float = 60) -> None:
    """Until each of the k instances writes one partition (the first one up takes all, then hands over)."""
    from runledger.ledger.ingest import partitions

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        writers = [partitions.Part(k, p).read_status(root).get("writer") for p in range(k)]
        if None not in writers and len(set(writers)) == k:
            time.sleep(1.0)  # (settled)
            return
        time.sleep(0.2)
    raise RuntimeError(f"the {k} instances did not spread over the partitions: {writers}")


def print_partitions(rows: list[dict]) -> None:
    print(f"{'K':>2} {'events':>8} {'events/s':>9} {'wall s':>7} {'load':>5} {'cpu us/ev per instance':>24} "
          f"{'stored per instance':>22} {'commit ms (median per partition)':>34}")
    for r in rows:
        cpu = " ".join(f"{c:.1f}" for c in r["cpu_us"])
        print(f"{r['k']:>2} {sum(r['stored']):>8} {r['events_per_s']:>9.0f} {r['wall_s']:>7.2f} {r['load']:>5.2f} "
              f"{cpu:>24} {' '.join(map(str, r['stored'])):>22} {' '.join(str(w) for w in r['ack_wait_ms']):>34}")
    base = rows[0]
    for r in rows[1:]:
        if r["k"] == rows[0]["k"]:  # (a new round: its own baseline)
            base = r
            continue
        print(f"K={r['k']} / K={base['k']}: events/s {r['events_per_s'] / base['events_per_s']:.2f}, "
              f"cpu us/event per instance (mean) {sum(r['cpu_us']) / len(r['cpu_us']) / (sum(base['cpu_us']) / len(base['cpu_us'])):.2f}")


# ------------------------------------------------------------------------------ raw nats-py


def _raw_producer(url: str, n: int, per_msg: int, q) -> None:
    async def go():
        nc = await bus.connect(url)
        js = nc.jetstream(publish_async_max_pending=512)
        events = make_events(n, "raw")
        t0 = time.time()
        futs = []
        for i in range(0, n, per_msg):
            chunk = events[i:i + per_msg]
            if per_msg == 1:
                subject, body, msg_id = subject_for("raw", "step"), chunk[0][1].encode(), chunk[0][0]["event_id"]
            else:
                subject = subject_for("raw", "step")
                body = ("[" + ",".join(t for _, t in chunk) + "]").encode()
                msg_id = f"{chunk[0][0]['event_id']}+{len(chunk)}"
            futs.append(await js.publish_async(subject, body, headers={"Nats-Msg-Id": msg_id}))
            if len(futs) >= 256:
                await asyncio.gather(*futs)
                futs = []
        await asyncio.gather(*futs)
        q.put(("producer", t0, time.time()))
        await nc.close()

    asyncio.run(go())


def _raw_consumer(url: str, n_msgs: int, q) -> None:
    async def go():
        nc = await bus.connect(url)
        js = nc.jetstream()
        await bus.ensure_stream(js)
        await bus.ensure_consumer(js, "raw")
        sub = await js.pull_subscribe_bind(durable="raw", stream=STREAM)
        q.put(("ready",))
        got = 0
        while got < n_msgs:
            try:
                msgs = await sub.fetch(service.FETCH_BATCH, timeout=service.FETCH_TIMEOUT_S)
            except (asyncio.TimeoutError, TimeoutError):
                continue
            for m in msgs:
                _ = (m.subject, m.data, m.metadata.sequence.stream)
                await m.ack()
            got += len(msgs)
        await nc.flush()
        q.put(("consumer", time.time()))
        await nc.close()

    asyncio.run(go())


def run_raw(url: str, n: int, per_msg: int) -> dict:
    q = mp.Queue()
    n_msgs = -(-n // per_msg)
    consumer = mp.Process(target=_raw_consumer, args=(url, n_msgs, q))
    consumer.start()
    assert q.get(timeout=60)[0] == "ready"
    producer = mp.Process(target=_raw_producer, args=(url, n, per_msg, q))
    producer.start()
    results = _collect(q, producer, consumer)
    return {"events_per_s": n / (results["consumer"][1] - results["producer"][1])}


# ------------------------------------------------------------------------------ pyarrow alone


def run_pyarrow(tmp: Path, n: int, per_file: int) -> dict:
    rows = [StoredEvent(env, canonical_json(env["payload"]), i + 1) for i, (env, _) in enumerate(make_events(n, "pa"))]
    t0 = time.time()
    for i in range(0, n, per_file):
        store.write_events(tmp / "pa-root", rows[i:i + per_file])
    return {"events_per_s": n / (time.time() - t0)}


def fresh_server(tmp: Path, name: str) -> NatsServer:
    return NatsServer(tmp / name).start()


def main() -> int:
    p = argparse.ArgumentParser(description="ingest throughput: e2e vs raw nats-py vs pyarrow alone")
    p.add_argument("--events", type=int, default=100_000, help="events per batched run")
    p.add_argument("--unbatched-events", type=int, default=30_000, help="events per one-event-per-message run")
    p.add_argument("--many", type=int, default=100, help="events per emit_many / emit_dicts call")
    p.add_argument("--backlog", type=int, default=200_000, help="events waiting when the ledger starts (the drain row)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each K of --partitions (alternating)")
    p.add_argument("--partitions", default=None, help="only the partition rows, for these K, e.g. 1,2")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rl-bench-ingest-"))
    if args.partitions:
        try:
            rows = []
            for r in range(args.rounds):
                for k in (int(x) for x in args.partitions.split(",")):
                    srv = fresh_server(tmp, f"nats-k{k}-{r}")
                    rows.append(run_partitions(srv.url, tmp / f"k{k}-{r}", args.backlog, k, args.many))
                    srv.stop()
            print_partitions(rows)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return 0
    rows = []
    try:
        raw_of = {}
        for mode, n, per_msg, batch, many, typed in (
                ("batched", args.events, MAX_BATCH_EVENTS, True, 1, True),
                ("emit_dicts", args.events, MAX_BATCH_EVENTS, True, args.many, False),
                ("emit_many", args.events, MAX_BATCH_EVENTS, True, args.many, True),
                ("1 event/msg", args.unbatched_events, 1, False, 1, True)):
            if per_msg not in raw_of:  # emit_many's and emit_dicts' raw baseline is the batched one
                srv = fresh_server(tmp, f"nats-raw-{per_msg}")
                raw_of[per_msg] = run_raw(srv.url, n, per_msg)
                srv.stop()
            srv = fresh_server(tmp, f"nats-e2e-{mode.replace(' ', '-').replace('/', '-')}")
            e2e = run_e2e(srv.url, tmp / f"e2e-{mode.replace(' ', '-').replace('/', '-')}", n, batch, many, typed)
            srv.stop()
            rows.append((mode, n, e2e, raw_of[per_msg]))
        srv = fresh_server(tmp, "nats-drain")
        drain = run_drain(srv.url, tmp / "drain", args.backlog, args.many)
        srv.stop()
        pa_rate = run_pyarrow(tmp, args.events, 2_000)["events_per_s"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'mode':<12} {'events':>8} {'e2e ev/s':>10} {'raw ev/s':>10} {'e2e/raw':>8} {'emit ev/s':>10} "
          f"{'NATS msgs':>10} {'prod cpu us/ev':>15} {'ledger cpu us/ev':>17}")
    for mode, n, e2e, raw in rows:
        print(f"{mode:<12} {n:>8} {e2e['events_per_s']:>10.0f} {raw['events_per_s']:>10.0f} "
              f"{e2e['events_per_s'] / raw['events_per_s']:>8.2f} {e2e['emit_per_s']:>10.0f} {e2e['messages']:>10} "
              f"{e2e['producer_us']:>15.1f} {e2e['ledger_us']:>17.1f}")
    for mode, n, e2e, _ in rows:
        print(f"{mode}: then compacting what was written took {e2e['compact_s']:.2f} s (the ledger does it when "
              f"idle); counting it, {e2e['with_compaction_per_s']:.0f} events/s")
    batched, many, single = rows[0][2]["events_per_s"], rows[2][2]["events_per_s"], rows[3][3]["events_per_s"]
    print(f"e2e batched / raw nats-py at one event per message = {batched / single:.2f} "
          f"(emit_many: {many / single:.2f})")
    print(f"drain: {args.backlog} events waiting when the ledger starts: {drain['events_per_s']:.0f} events/s, "
          f"ledger cpu {drain['ledger_us']:.1f} us/event (including its start)")
    print(f"pyarrow writer alone (2,000-row files, fsync'd, committed): {pa_rate:.0f} events/s; "
          f"e2e batched / pyarrow alone = {rows[0][2]['events_per_s'] / pa_rate:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
