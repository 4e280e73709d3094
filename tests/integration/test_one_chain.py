"""One process per chain: a second Emitter on a chain is refused; producers that clash anyway (two
hosts under one name) are both told, and the clash is quarantined and named by `verify`; producers
with no name given never clash; no role can make another's events disappear through Nats-Msg-Id.

Each test acts as the user or attacker: real processes, a real nats-server, a real ledger.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.bus import natsserver
from runledger.ledger.emit.chains import next_attempt
from runledger.ledger.emit.emitter import Emitter
from runledger.ledger.storage import locks
from runledger.tools.produce import step_payload
from support import REPO
from support.processes import LedgerProcess, cli, wait_serving
from support.reading import reader, wait_for_count


def test_a_second_emitter_on_a_chain_in_another_process_is_refused(tmp_path, nats_server):
    spool = tmp_path / "spool"
    first = Emitter("dup", "worker-0", 0, nats_server.url, spool)
    try:
        code = ("import sys; from runledger.ledger.emit.emitter import Emitter\n"
                "try:\n    Emitter('dup', 'worker-0', 0, sys.argv[1], sys.argv[2])\n"
                "except Exception as err:\n    print(err); sys.exit(2)\n")
        out = subprocess.run([sys.executable, "-c", code, nats_server.url, str(spool)], cwd=REPO, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 2, out.stderr
        line = out.stdout.strip()
        assert len(line.splitlines()) == 1 and "chain dup:worker-0:0" in line and "pid" in line
        with pytest.raises(locks.Busy):  # in this process too
            Emitter("dup", "worker-0", 0, nats_server.url, spool)
    finally:
        assert first.close(10)
    Emitter("dup", "worker-0", 0, nats_server.url, spool).close(10)  # closed: the chain is free again


def test_two_hosts_on_one_chain_are_both_told_and_the_clash_is_quarantined(tmp_path, nats_server, ledger_process):
    """The lock cannot reach across machines: two spools (two hosts) under one name, 200 steps each."""
    ledger_process.start()
    wait_serving(ledger_process)
    a = Emitter("dup", "worker-0", 0, nats_server.url, tmp_path / "host-a")
    b = Emitter("dup", "worker-0", 0, nats_server.url, tmp_path / "host-b")
    for i in range(200):
        a.emit_dict("step", step_payload(i), step=i)
        b.emit_dict("step", {**step_payload(i), "loss": 99.0 + i}, step=i)
    assert a.flush(30) and b.flush(30)  # JetStream has all 400
    assert a.close(60) is False
    assert b.close(60) is False
    # a's steps were stored first, so both are told of seqs 0..199; with signed heads on, each closes with a
    # chain_head at seq 200 too, and b's (its own key, over its own chain) clashes with a's stored one
    assert a.conflicts == set(range(200))
    assert b.conflicts == set(range(b.next_seq)) and b.next_seq in (200, 201)

    root = ledger_process.root
    con = reader(root)
    stored = con.execute("select count(*), count(distinct event_id) from steps_all where run_id = 'dup'").fetchone()
    clashed = con.execute("select count(*) from quarantine where reason like '%conflicting event%'").fetchone()[0]
    assert stored == (200, 200) and clashed == len(b.conflicts)  # nothing silently gone: each of b's is quarantined
    report = cli("verify", "--root", str(root))
    assert report.returncode == 1
    assert "dup:worker-0:0:0: a different event with this id is in quarantine" in report.stdout


def test_a_producer_alone_on_its_chain_is_confirmed(tmp_path, nats_server, ledger_process):
    ledger_process.start()
    wait_serving(ledger_process)
    em = Emitter("alone", "worker-0", 0, nats_server.url, tmp_path / "spool")
    em.emit_dicts("step", [step_payload(i) for i in range(500)], list(range(500)))
    assert em.close(60) is True and em.confirmed and not em.conflicts


def test_eight_processes_with_no_producer_name_store_every_event_once(tmp_path, nats_server, ledger_process):
    ledger_process.start()
    code = ("import sys; from runledger.ledger.emit.emitter import Emitter; from runledger.tools.produce import step_payload\n"
            "em = Emitter('shared', None, nats_url=sys.argv[1], spool_dir=sys.argv[2])\n"
            "em.emit_dicts('step', [step_payload(i) for i in range(300)], list(range(300)))\n"
            "sys.exit(0 if em.close(120) else 1)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, nats_server.url, str(tmp_path / "spool")], cwd=REPO,
                              stderr=subprocess.PIPE, text=True) for _ in range(8)]
    for p in procs:
        assert p.wait(180) == 0, p.stderr.read()
    root = ledger_process.root
    assert wait_for_count(root, "select count(*) from steps_all", 2_400) == 2_400
    con = reader(root)
    assert con.execute("select count(distinct event_id), count(distinct producer) from steps_all").fetchone() == (2_400, 8)
    assert cli("verify", "--root", str(root)).returncode == 0


def test_a_resumed_producer_gets_its_attempt_from_the_ledger(tmp_path, nats_server, ledger_process):
    spool = tmp_path / "spool"
    with pytest.raises(RuntimeError, match="no ledger answers"):
        next_attempt("resume", "worker-0", spool, nats_url=nats_server.url)
    ledger_process.start()
    wait_serving(ledger_process)
    for expected in (0, 1):
        other_machine = tmp_path / f"spool-{expected}"  # the ledger knows what this machine's spool does not
        em = Emitter("resume", "worker-0", None, nats_server.url, other_machine)
        assert em.attempt == expected
        em.emit_dict("step", step_payload(0), step=0)
        assert em.close(60)
    assert Emitter("resume", "worker-0", None, nats_server.url, spool).attempt == 2


def test_msg_id_hijack_by_another_run_cannot_suppress_events(tmp_path):
    """worker-r1 publishes junk on its own subject under Nats-Msg-Ids that r2's events would use."""
    root = tmp_path / "root"
    natsserver.up(root, secure=True, runs=("r1", "r2"))
    creds = natsserver.nats_dir(root) / "creds"
    url = {name: natsserver.read_creds(creds / f"{name}.creds") for name in ("ledger", "worker-r1", "worker-r2")}
    ledger = LedgerProcess(root, url["ledger"], tmp_path / "ledger.log").start()
    try:
        wait_serving(ledger)

        async def hijack():
            nc = await bus.connect(url["worker-r1"])
            js = nc.jetstream()
            for seq in range(50):  # every id the victim could use, in the forms a guesser would try
                for mid in (f"r2:worker-0:0:{seq}", f"r2:worker-0:0:{seq}:", f"r2:worker-0:0:0+50:{seq}"):
                    await js.publish("runledger.r1.step", b"junk", headers={"Nats-Msg-Id": mid})
            await nc.close()

        asyncio.run(hijack())
        victim = Emitter("r2", "worker-0", 0, url["worker-r2"], tmp_path / "spool")
        for i in range(50):
            victim.emit_dict("step", step_payload(i), step=i)
        assert victim.close(60) is True and victim.confirmed  # the verdict is asked under the worker's permissions
        assert wait_for_count(root, "select count(*) from steps where run_id = 'r2'", 50) == 50
        assert cli("verify", "--root", str(root)).returncode == 0
    finally:
        ledger.kill()
        natsserver.down(root)
