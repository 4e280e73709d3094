"""Verify and replay at scale: `runledger verify`, `replay` and `verify --since` on 1M and 10M sealed
events, side by side with the floor (the same files read by pyarrow and every hash recomputed in a
plain loop), in one command:

    python -m bench.verify [--sizes 1000000 10000000] [--jobs N] [--keep DIR] [--cold] [--before DIR]

Each measured command runs as its own process (`runledger ...`), so its wall time and peak RSS are
what a user sees: the peak RSS of that process (GNU time), and that of all its processes together
with their CPU seconds (psutil, sampled: verify's row-checking processes are in it). The ledger is one run, one worker chain: per 1,000
steps, 1,000 `step` events sealed at once (`runledger.ledger.emit.sealing.seal_many` through `ParquetSink`, the
project's writer), then an `eval` and a `checkpoint`; the ledger's small files are compacted as the
ledger does. `verify --since` is measured after 1% more events are written (new files), with and without
`--assume-unchanged` (which does not hash again the files checked before). `--cold` drops the root
from the page cache before each command.

Goals (issue 23): verify >= 200k events/s, replay >= 500k events/s on 2 cores, peak RSS <= 1 GB.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runledger.ledger.storage import compaction, heads, paths
from runledger.ledger.emit.sink import ParquetSink

log = logging.getLogger("bench.verify")

RUN_ID = "big"
STEPS_PER_BLOCK = 1_000  # step events sealed at once; an eval and a checkpoint after each block
FLUSH_EVENTS = 250_000  # events per write: the ledger writes smaller files and compacts them


def step_payloads(first_step: int, n: int) -> list[dict]:
    return [{"loss": 2.5 + 8.0 / (1 + (first_step + i) / 200) ** 0.5, "grad_norm": 1.0 + ((first_step + i) % 13) * 0.01,
             "lr": 3e-4, "tokens": 8192, "step_time_s": 0.5, "mfu": 0.31} for i in range(n)]


def write_sealed_run(root: Path, events: int, run_id: str = RUN_ID, flush_events: int = FLUSH_EVENTS,
                     compact: bool = True) -> int:
    """Append about `events` sealed events of one run's worker chain to `root` (continuing the chain
    if the root holds it); return the events written."""
    root = Path(root)
    recorded = heads.run_file(root, run_id)
    head = heads.read_run(recorded).get(("worker-0", 0)) if recorded.exists() else None
    sink = ParquetSink(root, run_id, flush_every=flush_events)
    if head is not None:  # continue the chain (ParquetSink starts a chain at seq 0)
        sink._seq, sink._prev_hash = head[0] + 1, head[1]
    written = 0
    step = 0 if head is None else head[0]  # (a step number per event is enough for the bench)
    while written < events:
        n = min(STEPS_PER_BLOCK, events - written)
        sink.emit_dicts("step", step_payloads(step, n), list(range(step, step + n)))
        step += n
        written += n
        if written + 2 <= events:
            sink.emit_dict("eval", {"loss": 2.6, "domain_losses": {"web": 2.7, "code": 2.2}}, step=step)
            sink.emit_dict("checkpoint", {"path": f"ckpt/{step}", "bytes": 1 << 30, "seconds": 3.0,
                                          "content_hash": f"{step:064x}", "tokens_seen": step * 8192}, step=step)
            written += 2
    sink.close()
    if compact:
        compaction.compact(root)
    return written


def floor(root: Path) -> int:
    """The floor: every events file read by pyarrow (the columns a hash needs) and every hash recomputed
    in a plain loop from the envelope's canonical text; returns the events hashed."""
    from runledger.ledger.contract.canonical import event_hash

    import pyarrow.parquet as pq

    n = 0
    columns = ["attempt", "event_id", "kind", "payload", "prev_hash", "producer", "run_id", "schema_version", "seq",
               "step", "time", "hash"]
    for f in paths.event_files(root):
        for batch in pq.ParquetFile(f).iter_batches(columns=columns):
            for row in batch.to_pylist():
                n += event_hash(row, row["payload"]) == row["hash"]
    return n


SAMPLE_S = 0.1  # how often the process tree's memory and CPU time are sampled


def measure(argv: list[str], cwd: Path | None = None) -> dict:
    """Run a command as a child process: its wall time, its own peak RSS (MiB, by GNU time, exact), and,
    sampled every SAMPLE_S by psutil, the peak RSS of all its processes together (verify's row checkers
    and the server they are forked from are not its children for GNU time) and their CPU seconds."""
    import psutil

    with tempfile.NamedTemporaryFile("r") as peak, tempfile.TemporaryFile("w+") as out:
        started = time.monotonic()
        proc = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", peak.name, *argv], stdout=out, stderr=subprocess.PIPE,
                                text=True, cwd=cwd)
        top, tree_peak, cpu = psutil.Process(proc.pid), 0, {}
        while proc.poll() is None:
            try:
                procs = [top, *top.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            rss = 0
            for p in procs:
                try:
                    with p.oneshot():
                        rss += p.memory_info().rss
                        times = p.cpu_times()
                        cpu[p.pid] = times.user + times.system
                except psutil.NoSuchProcess:
                    pass
            tree_peak = max(tree_peak, rss)
            time.sleep(SAMPLE_S)
        stderr = proc.stderr.read()
        wall = time.monotonic() - started
        peak_kib = int(peak.read().split()[-1])
        out.seek(0)
        stdout = out.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {stdout[-500:]} {stderr[-500:]}")
    return {"wall_s": wall, "peak_mib": peak_kib / 1024, "tree_peak_mib": max(tree_peak / 2**20, peak_kib / 1024),
            "cpu_s": sum(cpu.values()), "out": stdout}


def evict(root: Path) -> None:
    """Drop the files under `root` from the page cache (their clean pages: what was written is synced
    first), so that the next reader reads them from the disk."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="build the roots here and keep them")
    parser.add_argument("--cold", action="store_true",
                        help="before each measured command, drop the root's files from the page cache "
                             "(posix_fadvise DONTNEED), so that each reads them from the disk")
    parser.add_argument("--before", type=Path, default=None, metavar="DIR",
                        help="also run verify and replay from the checkout in DIR (e.g. `git archive` of an earlier "
                             "commit), in the same command: before and after under the same load")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    base = args.keep or Path(tempfile.mkdtemp(prefix="bench-verify-"))
    cli = [sys.executable, "-m", "runledger.tools.cli"]
    jobs = ["--jobs", str(args.jobs)] if args.jobs else []
    rows = []
    print(f"(peak RSS: of the command's own process, exact; then of all its processes, sampled every {SAMPLE_S} s; "
          f"cpu-s: of all its processes, sampled) {load()}")
    for size in args.sizes:
        root = base / f"root-{size}"
        if not root.exists():
            started = time.monotonic()
            write_sealed_run(root, size)
            log.info("built %d events in %.0f s", size, time.monotonic() - started)
        record = base / f"verified-{size}.json"
        cold = (lambda: evict(root)) if args.cold else (lambda: None)
        cold()
        v = measure([*cli, "verify", "--root", str(root), "--format", "json", "--record", str(record), *jobs])
        cold()
        r = measure([*cli, "replay", RUN_ID, "--root", str(root), "--format", "json"])
        before = []
        if args.before:  # (the same work: --record, which hashes every file's bytes too)
            cold()
            before.append(("verify, before", measure([*cli, "verify", "--root", str(root), "--format", "json", "--record",
                                                      str(base / f"verified-before-{size}.json"), *jobs], args.before), 0))
            cold()
            before.append(("replay, before", measure([*cli, "replay", RUN_ID, "--root", str(root), "--format", "json"],
                                                     args.before), 0))
        cold()
        f = measure([sys.executable, "-c", f"from bench.verify import floor; print(floor({str(root)!r}))"])
        extra = size // 100
        write_sealed_run(root, extra, compact=False)
        cold()  # (--record elsewhere: the record stays where it was for the next one)
        q = measure([*cli, "verify", "--root", str(root), "--format", "json", "--since", str(record), "--assume-unchanged",
                     "--record", str(base / f"verified-quick-{size}.json"), *jobs])
        cold()
        s = measure([*cli, "verify", "--root", str(root), "--format", "json", "--since", str(record), *jobs])
        checked = json.loads(s["out"])["checked_events"]
        assert json.loads(q["out"])["checked_events"] == checked
        rows.append((size, v, r, f, s, checked))
        events = json.loads(v["out"])["events"]  # (a root kept from an earlier run has its 1% more)
        for name, m, n in (("verify", v, events), ("replay", r, events), *((w, m, events) for w, m, _ in before),
                           ("floor (pyarrow + loop hash)", f, events), ("verify --since (+1%)", s, checked),
                           ("  --assume-unchanged", q, checked)):
            print(f"{events:>10,} {name:<28} {m['wall_s']:8.2f} s {n / m['wall_s']:>12,.0f} ev/s "
                  f"{m['peak_mib']:8.0f} MiB {m['tree_peak_mib']:8.0f} MiB all {m['cpu_s']:8.2f} cpu-s")
        print(f"{'':>10} verify / floor wall: {v['wall_s'] / f['wall_s']:.2f}x; since / full: {s['wall_s'] / v['wall_s']:.3f}x; "
              f"assuming unchanged: {q['wall_s'] / v['wall_s']:.3f}x; {load()}")
    if args.keep is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
