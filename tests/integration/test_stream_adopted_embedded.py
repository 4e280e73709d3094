"""On the embedded default, a lost server folder (a new stream, its seqs from 1 again) never leaves the
root unable to start: the supervisor adopts the new stream, says so in one line, and the ledger takes
it from its first message with nothing lost or stored twice."""

from __future__ import annotations

import shutil

import runledger
from runledger.ledger import local, settings
from runledger.ledger.storage import streampos
from support.processes import verify
from runledger.ledger.storage.reads import read_events
from support.reading import wait_for_count


def log_metrics(name: str, steps: int) -> str:
    run = runledger.init(project="adopt", name=name, system_metrics=False)
    for step in range(steps):
        runledger.log({"loss": 1.0 / (step + 1)})
    assert run.finish()
    wait_for_count(settings.root(), f"select count(*) from runs_finished where run_id = '{run.id}'", 1)
    return run.id


def test_a_lost_server_folder_is_adopted_with_one_line(local_root):
    first = log_metrics("before", 50)
    assert local.down(local_root)
    was = streampos.adopted(local_root)
    shutil.rmtree(settings.nats_dir(local_root))  # the server's folder lost: the stream is made anew

    second = log_metrics("after", 50)
    said = [line for line in (local_root / "local" / "supervisor.log").read_text().splitlines() if "adopted stream" in line]
    assert len(said) == 1 and "the local server's folder was lost" in said[0], said
    assert was is None and streampos.adopted(local_root) is not None
    events = read_events(local_root, columns=["run_id", "event_id", "kind"]).to_pylist()
    ids = [e["event_id"] for e in events]
    assert len(ids) == len(set(ids))  # nothing stored twice
    for run in (first, second):
        assert sum(1 for e in events if e["run_id"] == run and e["kind"] == "metrics") == 50  # nothing lost
    assert verify(local_root)[0] == 0
