"""Two machines' ledgers on one bucket: two ledger instances, each on a root of its own (the local state a
machine keeps: locks, positions, status records, the transparency log), sharing one PostgreSQL
catalog (a real Debian `postgres`) and one bucket (a real Swift s3api server), serving the root's
partitions by lease. The writer of a partition is SIGKILLed while producers publish; the other machine's
instance takes its partitions over.

The promises under attack: every event stored once (in the bucket, none under either root), `verify`
ok from either root (the chain heads are in the bucket, so each root finds every run's), and the other
machine's instance takes every partition of the dead one over. The time a partition was without a writer is
measured from the new writer's takeover record, printed for bench/RESULTS.md: run with -s; not asserted, as the
time depends on the machine's load.
"""

from __future__ import annotations

import json
import sys
import time
import uuid

import pytest

from runledger import queries
from runledger.ledger.ingest.partitions import LEASE_TTL_S, Part, partition_of
from support import s3
from support.postgres import postgres  # noqa: F401 (a fixture)
from support.processes import LedgerProcess, cli, kill_all, start_producer
from support.reading import wait_for_count
from support.s3 import swift  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(not s3.available(), reason="no Swift for the S3 tests: `make s3` installs it")

K = 4
RUNS = [f"run{i}" for i in range(6)]
PER_RUN = 2_000
RATE = 400  # events/s per producer: still publishing when a writer is killed


def writers_of(roots) -> dict[int, str]:
    """partition -> the instance writing it now, from the status records of every root (each machine
    records the partitions its own instance writes)."""
    out: dict[int, tuple[float, str]] = {}
    for root in roots:
        for p in range(K):
            doc = Part(K, p).read_status(root)
            if doc.get("writer") and time.time() - doc.get("renewed", 0) < LEASE_TTL_S:
                if doc["renewed"] > out.get(p, (0.0, ""))[0]:
                    out[p] = (doc["renewed"], doc["writer"])
    return {p: w for p, (_, w) in out.items()}


def wait_spread(roots, timeout=90) -> dict[int, str]:
    """Until every partition has a writer and each machine's instance writes some."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = writers_of(roots)
        if len(found) == K and len(set(found.values())) == len(roots):
            return found
        time.sleep(0.2)
    raise AssertionError(f"the partitions were not spread over both machines: {writers_of(roots)}")


def test_two_roots_on_one_catalog_and_one_bucket_store_every_event_once_across_a_takeover(
        swift, postgres, nats_server, tmp_path, monkeypatch):
    for k, v in swift.credentials().items():
        monkeypatch.setenv(k, v)  # (each instance keeps them in its root's s3.credentials)
    warehouse = f"s3://{swift.bucket(f'shared-{uuid.uuid4().hex[:12]}')}/tables"
    roots = [tmp_path / "machine-a", tmp_path / "machine-b"]
    args = ("--partitions", str(K), "--catalog", postgres.uri, "--warehouse", warehouse)
    instances = [LedgerProcess(r, nats_server.url, tmp_path / f"ledger-{r.name}.log", *args).start() for r in roots]
    producers = []
    try:
        wait_spread(roots)
        producers = [start_producer(nats_server.url, tmp_path / "spool", run, "worker-0", PER_RUN, RATE) for run in RUNS]
        victim_partition = partition_of(RUNS[0], K)
        time.sleep(2.0)
        holder = writers_of(roots)[victim_partition]
        victim = next(lp for lp in instances if lp.proc.pid == int(holder.split(":")[1]))
        survivor = next(lp for lp in instances if lp is not victim)
        taken = [p for p, w in writers_of(roots).items() if w == holder]
        victim.kill()  # SIGKILL: mid-batch, mid-commit, whatever it was doing
        deadline = time.monotonic() + 60
        while any(writers_of([survivor.root]).get(p) is None for p in taken) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(writers_of([survivor.root]).get(p) for p in taken), "the other machine took nothing over"
        for p in producers:
            assert p.wait(180) == 0, p.stderr.read()
        total = PER_RUN * len(RUNS)
        for root in roots:  # (either machine reads the whole ledger: the catalog and the bucket are shared)
            assert wait_for_count(root, "select count(*) from steps", total, timeout=180) == total
        time.sleep(2.0)  # anything doubled would come with the last commits
        counts = [wait_for_count(root, "select count(distinct event_id) from steps", total, timeout=30) for root in roots]
        for root in roots:
            assert queries.query(root, "select count(*), count(distinct event_id) from steps")[1] == [(total, total)]
            assert queries.query(root, "select count(*) = count(distinct event_id) from events")[1] == [(True,)]  # (heads too)
            assert queries.query(root, "select count(*) from quarantine")[1] == [(0,)]
            assert not list(root.rglob("*.parquet")) and not list(root.rglob("*.avro")), "table files under a root"
        assert counts == [total, total]
        for root in roots:
            done = cli("verify", "--root", str(root))
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        takeovers = [t for p in taken for t in Part(K, p).read_status(survivor.root).get("takeovers", [])
                     if t["from"] == holder]
        assert len(takeovers) == len(taken), takeovers
        longest = max(t["gap_s"] for t in takeovers)
        sys.stderr.write(f"\ntwo roots, one catalog, one bucket: {total} events, {counts[0]} stored once, "
                         f"{len(taken)} partitions taken over, longest without a writer {longest:.2f} s "
                         f"(lease TTL {LEASE_TTL_S} s; {json.dumps([round(t['gap_s'], 2) for t in takeovers])})\n")
    finally:
        kill_all(producers, instances)
