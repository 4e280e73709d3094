"""Partitioned ingest: 3 ledger instances share 4 partitions by run; the active writer of a partition is
SIGKILLed twice while producers publish, a standby takes over, and nothing is lost or doubled.

The promise under attack: exactly once across a takeover (a run's events, and its dedupe, stay in one
partition), and a partition is without a writer only for about the lease's TTL. The longest time
without a writer is measured from the writers' own takeover records (ledger/ingest/partitions/__init__.py), and printed.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter

import pytest

from runledger.ledger.ingest import partitions
from runledger.ledger.ingest.partitions import LEASE_TTL_S, Part, partition_of
from support.processes import LedgerProcess, cli, kill_all, runledger, start_producer
from support.reading import reader, wait_for_count

K = 4
INSTANCES = 3
RUNS = [f"run{i}" for i in range(6)]  # spread over the 4 partitions (checked below)
PER_RUN = 3_000
RATE = 600  # events/s per producer: the producers are still publishing when the writers are killed


def serving(root) -> dict[int, str]:
    """partition -> the instance whose writer serves it, from the status records."""
    out = {}
    for p in range(K):
        doc = Part(K, p).read_status(root)
        if doc.get("writer") and time.time() - doc.get("renewed", 0) < LEASE_TTL_S:
            out[p] = doc["writer"]
    return out


def wait_all_served(root, timeout=60) -> dict[int, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = serving(root)
        if len(found) == K:
            return found
        time.sleep(0.2)
    raise AssertionError(f"not every partition has a writer: {serving(root)}")


def wait_balanced(root, timeout=60) -> dict[int, str]:
    """Until every partition has a writer and no instance writes more than its share, ceil(K / INSTANCES)
    (the first instance up takes them all, then hands the ones past its share over)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = serving(root)
        if len(found) == K and max(Counter(found.values()).values()) <= -(-K // INSTANCES):
            return found
        time.sleep(0.2)
    raise AssertionError(f"the partitions were not spread over the instances: {serving(root)}")


def pid_of(instance: str) -> int:
    return int(instance.split(":")[1])


def test_killing_a_partitions_writer_twice_loses_and_doubles_nothing(tmp_path, nats_server, root):
    instances = [LedgerProcess(root, nats_server.url, tmp_path / f"ledger-{i}.log", "--partitions", str(K)).start()
                 for i in range(INSTANCES)]
    producers = []
    try:
        wait_balanced(root)
        producers = [start_producer(nats_server.url, tmp_path / "spool", run, "worker-0", PER_RUN, RATE) for run in RUNS]
        victim_partition = partition_of(RUNS[0], K)
        for kill in range(2):
            time.sleep(1.5)
            holder = wait_all_served(root)[victim_partition]
            by_pid = {lp.proc.pid: lp for lp in instances}
            victim = by_pid[pid_of(holder)]
            victim.kill()  # SIGKILL: mid-batch, mid-commit, whatever it was doing
            deadline = time.monotonic() + 30
            while serving(root).get(victim_partition) in (None, holder) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert serving(root).get(victim_partition) not in (None, holder), "no standby took the partition over"
            instances[instances.index(victim)] = LedgerProcess(
                root, nats_server.url, tmp_path / f"ledger-restarted-{kill}.log", "--partitions", str(K)).start()
        for p in producers:
            assert p.wait(180) == 0, p.stderr.read()
        total = PER_RUN * len(RUNS)
        assert wait_for_count(root, "select count(*) from steps", total, timeout=120) == total
        con = reader(root)
        assert con.execute("select count(distinct event_id) from steps").fetchone()[0] == total
        assert con.execute("select count(*) from quarantine").fetchone()[0] == 0
        assert cli("verify", "--root", str(root)).returncode == 0

        takeovers = [t for p in range(K) for t in Part(K, p).read_status(root).get("takeovers", [])]
        assert len([t for t in takeovers if pid_of(t["from"]) not in {lp.proc.pid for lp in instances}]) >= 2
        longest = max(t["gap_s"] for t in takeovers)
        sys.stderr.write(f"\nlongest time a partition was without a writer: {longest:.2f} s "
                         f"(lease TTL {LEASE_TTL_S} s; {len(takeovers)} takeovers: "
                         f"{json.dumps([round(t['gap_s'], 2) for t in takeovers])})\n")
        assert longest < 4 * LEASE_TTL_S  # "a few seconds": the TTL, a poll, and loading what is stored

        status = runledger("status", "--root", str(root), "--nats", nats_server.url, "--format", "json", timeout=60)
        assert status.returncode == 0, status.stderr
        rows = json.loads(status.stdout)["partitions"]
        assert [r["partition"] for r in rows] == list(range(K))
        assert all(r["writer"] and r["pending"] == 0 and r["last_commit"] for r in rows), rows
    finally:
        kill_all(producers, instances)


def test_a_single_ledger_and_partitioned_instances_do_not_share_a_root(tmp_path, nats_server, root):
    first = LedgerProcess(root, nats_server.url, tmp_path / "p.log", "--partitions", str(K)).start()
    try:
        wait_all_served(root)
        single = runledger("ledger", "serve", "--root", str(root), "--nats", nats_server.url, timeout=60)
        assert single.returncode == 2 and "in use" in single.stderr
        other_k = runledger("ledger", "serve", "--root", str(root), "--nats", nats_server.url, "--partitions", "2",
                            timeout=60)
        assert other_k.returncode == 2 and "4 partitions" in other_k.stderr
    finally:
        first.kill()
    assert partitions.layout(root) == K


@pytest.mark.parametrize("bad", ["0", "-3"])
def test_a_partition_count_below_one_is_refused(bad, tmp_path):
    assert runledger("ledger", "serve", "--root", str(tmp_path), "--partitions", bad, timeout=60).returncode == 2
