"""`verify` streams: a change anywhere in a million events is still named; `verify --since` checks only
what came after a verify it recorded, and fails when the new events do not continue the chains it
checked; `replay` streams to the same state as the fold of every event in memory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bench.verify import write_sealed_run
from runledger.ledger.storage import paths
from runledger.ledger.storage.digest import with_digest
from support.processes import verify
from support.runs import set_cell

# ---------------------------------------------------------------------------------------- a million events


@pytest.fixture(scope="module")
def million(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("million") / "root"
    write_sealed_run(root, 1_000_000, run_id="big")
    return root


@pytest.mark.slow
def test_a_tampered_event_a_broken_link_and_a_cut_head_are_named_in_a_million(million, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(million, root)
    first, second, *_, last = paths.event_files(root, "step", "big")
    t = pq.read_table(first)  # a loss changed in the hashed payload text, the file's digest kept
    i = 123_456 % t.num_rows
    payload = json.loads(t.column("payload")[i].as_py())
    payload["loss"] = 0.5
    tampered = t.column("event_id")[i].as_py()
    pq.write_table(set_cell(t, "payload", i, json.dumps(payload, separators=(",", ":"), sort_keys=True)), first)
    t = pq.read_table(second)  # a link cut: a prev_hash pointing elsewhere
    j = t.num_rows // 2
    broken = t.column("event_id")[j].as_py()
    pq.write_table(set_cell(t, "prev_hash", j, "0" * 64), second)
    t = pq.read_table(last)  # the head cut off: the last 10 events gone, the digest recomputed
    pq.write_table(with_digest(t.slice(0, t.num_rows - 10).replace_schema_metadata(None)), last)

    rc, out = verify(root, "--jobs", "2")
    assert rc == 1
    assert f"{tampered} (" in out and "hash does not match" in out, out
    assert f"{broken}: prev_hash does not match the hash of seq" in out, out
    assert "chain big:worker-0:0: the ledger stored it up to seq 999999, but it ends at seq" in out, out
