"""Relaying on a secure server (`runledger push` as the `relay` role): the relay may carry other producers'
events only on relayed subjects naming it, the ledger records who relayed each chain, and the hashes
prove the events unchanged; a worker's credential trying the same is refused, and stores nothing."""

from __future__ import annotations

import asyncio

import pytest

from runledger.ledger import push as pushing
from runledger.ledger.storage import relays
from support.processes import cli, verify
from support.reading import reader
from support.secure import secure, secure_server, url  # noqa: F401 (fixtures)
from support.pushing import offline_root


def count(root) -> tuple[int, int]:
    return reader(root).execute("select count(*), count(distinct event_id) from steps").fetchone()


def test_a_relay_carries_other_producers_chains_and_a_worker_cannot(secure, tmp_path):
    root, creds = secure
    src = offline_root(tmp_path / "laptop", ["r1", "r2"], "r3", n=20)

    worker = url(creds, "worker-r1")  # a worker's own credential, trying to carry every chain
    with pytest.raises(pushing.Refused):
        asyncio.run(pushing.push(src, worker, wait_s=20))
    refused = cli("push", str(src), "--to", worker)
    assert refused.returncode != 0 and "refused" in refused.stderr.lower()
    assert not list(root.glob("events/kind=step/*"))  # nothing stored from it

    done = cli("push", str(src), "--to", url(creds, "relay"))
    assert done.returncode == 0 and "3 chains stored on the receiver, 0 refused" in done.stdout, done.stdout + done.stderr
    assert count(root) == (60, 60)
    source = (src / "ledger.id").read_text().strip()  # (the laptop root's id: where the chains came from)
    for run in ("r1", "r2", "r3"):
        assert [(r["relay"], r["from"]) for r in relays.read_run(root, run)["worker-0:0"]] == [("relay", source)]
    assert verify(root)[0] == 0
