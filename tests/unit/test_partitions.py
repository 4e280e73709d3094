"""Partitioned ingest: 3 ledger instances share 4 partitions by run; the active writer of a partition is
SIGKILLed twice while producers publish, a standby takes over, and nothing is lost or doubled.

The promise under attack: exactly once across a takeover (a run's events, and its dedupe, stay in one
partition), and a partition is without a writer only for about the lease's TTL. The longest time
without a writer is measured from the writers' own takeover records (ledger/ingest/partitions/__init__.py), and printed.
"""

from __future__ import annotations

import json

from runledger.ledger.ingest.partitions import partition_of
from support.processes import cli

K = 4
RUNS = [f"run{i}" for i in range(6)]  # spread over the 4 partitions (checked below)


def test_a_run_goes_to_the_partition_nats_server_maps_it_to():
    # nats-server's partition(4, 1) for these runs, read off a real server (see the module's docstring)
    assert [partition_of(r, 4) for r in ("run0", "run1", "run2", "run3")] == [2, 1, 0, 3]
    assert {partition_of(r, K) for r in RUNS} == set(range(K))


def test_status_of_a_single_ledgers_root_without_nats_says_what_it_last_recorded(tmp_path):
    (tmp_path / "ledger.position").write_text("42")
    out = cli("status", "--root", str(tmp_path), "--nats", "nats://127.0.0.1:1", "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["partitions_total"], doc["live"]) == (1, False)
    assert doc["partitions"][0]["position"] == 42 and doc["partitions"][0]["writer"] is None
