"""`runledger push ROOT --to NATS_URL`: a root's chains, stored and still spooled, onto a fresh central
ledger verbatim: every event once, the same hashes (verify holds on both sides); cut off and run again,
nothing twice; a chain the receiver holds differently refused and named."""

from __future__ import annotations

import asyncio

import pytest

from runledger.ledger import push as pushing
from runledger.ledger.storage import relays
from support.pushing import offline_root
from support.processes import cli, verify, wait_serving
from support.reading import reader


def stored_rows(root) -> tuple[int, int, int]:
    return reader(root).execute("select count(*), count(distinct event_id), count(distinct hash) from steps").fetchone()


def hashes(root) -> set:
    return set(reader(root).execute("select event_id, hash from steps").fetchall())


def test_a_root_with_three_runs_one_spooled_goes_to_a_fresh_ledger_once(ledger_process, nats_server, root, tmp_path,
                                                                        monkeypatch):
    src = offline_root(tmp_path / "laptop", ["run-a", "run-b"], "run-c")
    ledger_process.start()
    wait_serving(ledger_process)

    # cut off: the second chain's publish dies halfway
    real, calls = pushing._publish, []

    async def cut_off(js, items, refusals=None):
        calls.append(len(items))
        if len(calls) == 2:
            await real(js, items[:len(items) // 2], refusals)
            raise ConnectionError("cut off")
        return await real(js, items, refusals)

    with monkeypatch.context() as m:
        m.setattr(pushing, "_publish", cut_off)
        with pytest.raises(ConnectionError):
            asyncio.run(pushing.push(src, nats_server.url))

    r = cli("push", str(src), "--to", nats_server.url)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 chains stored on the receiver, 0 refused" in r.stdout
    sent = int(r.stdout.split("pushed ")[1].split()[0])
    assert sent == 120 - 40 - 20  # the first chain and half the second were stored before the cut: not sent again
    assert stored_rows(root) == (120, 120, 120)
    assert hashes(root) >= hashes(src) and len(hashes(root) - hashes(src)) == 40  # (run-c's from the spool)
    assert verify(root)[0] == 0 and verify(src)[0] == 0
    assert relays.read_run(root, "run-c")["worker-0:0"][0]["relay"] == "relay"  # (who carried it: an open server's default name)

    again = cli("push", str(src), "--to", nats_server.url)  # once more: nothing sent, nothing stored twice
    assert again.returncode == 0 and "pushed 0 events" in again.stdout, again.stdout + again.stderr
    assert stored_rows(root) == (120, 120, 120)

    other = offline_root(tmp_path / "other", ["run-a"], None, n=10)  # the same run and producer, other events
    refused = cli("push", str(other), "--to", nats_server.url)
    assert refused.returncode == 1
    assert "refused chain run-a:worker-0:0" in refused.stderr, refused.stdout + refused.stderr
    assert stored_rows(root) == (120, 120, 120)
