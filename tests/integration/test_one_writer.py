"""One ledger per root: a second `ledger serve` is refused, a killed one's lock is gone at once, and
a root written twice before the lock is found by `verify` and mended by `verify --repair`.

Each test acts as the operator who starts a second ledger by mistake (or hoping for failover), with a
real nats-server and real `runledger` processes.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time

from runledger.ledger.bus import consumers
from runledger.ledger.bus import jetstream as bus
from runledger.ledger.contract.events import STREAM
from runledger.ledger.emit.emitter import Emitter
from runledger.ledger.ingest import service
from runledger.tools.produce import step_payload
from support.processes import LedgerProcess, cli, runledger, start_producer
from support.reading import reader, wait_for_count


def lock_holder(root) -> int | None:
    try:
        return json.loads((root / "ledger.lock").read_text() or "null")["pid"]
    except (OSError, ValueError, TypeError):
        return None


def wait_holding_lock(lp: LedgerProcess, timeout: float = 60) -> None:
    """Until the process holds the root's lock and has bound its consumer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lock_holder(lp.root) == lp.proc.pid and b"ledger serving" in lp.log_path.read_bytes():
            return
        assert lp.proc.poll() is None, lp.log_path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"ledger did not start serving: {lp.log_path.read_text()}")


def emit_payload_steps(url, spool, run_id, n, producer="worker-0") -> int:
    """Emit `n` steps on one chain; the events sent (with signed heads on, the chain_head sealed at close too)."""
    with Emitter(run_id, producer, 0, url, spool) as em:
        em.emit_dicts("step", [step_payload(i) for i in range(n)], list(range(n)))
    return em.next_seq


def test_a_second_ledger_on_a_served_root_is_refused_and_a_killed_ones_lock_goes_with_it(tmp_path, nats_server, root):
    first = LedgerProcess(root, nats_server.url, tmp_path / "first.log").start()
    try:
        wait_holding_lock(first)
        second = runledger("ledger", "serve", "--root", str(root), "--nats", nats_server.url, timeout=60)
        assert second.returncode == 2
        line = second.stderr.strip()
        assert len(line.splitlines()) == 1, line
        assert f"pid {first.proc.pid}" in line and socket.gethostname() in line and str(root) in line

        first.kill()  # SIGKILL: no chance to clean up; the OS drops the lock with the process
        third = LedgerProcess(root, nats_server.url, tmp_path / "third.log").start()
        wait_holding_lock(third, timeout=20)
        emit_payload_steps(nats_server.url, tmp_path / "spool", "after", 10)
        assert wait_for_count(root, "select count(*) from steps", 10, timeout=60) == 10
        third.kill()
    finally:
        first.kill()


def test_a_second_root_on_the_same_consumer_is_refused(tmp_path, nats_server, root):
    first = LedgerProcess(root, nats_server.url, tmp_path / "first.log").start()
    other = tmp_path / "other-root"
    try:
        wait_holding_lock(first)
        second = runledger("ledger", "serve", "--root", str(other), "--nats", nats_server.url, timeout=60)
        assert second.returncode == 2, second.stderr
        refusal = second.stderr.strip().splitlines()[-1]  # (after the log lines of its start)
        assert refusal.startswith("runledger ledger: consumer 'ledger' belongs to another ledger root") and str(root) in refusal
        # its own consumer is fine, and both roots then get every event
        own = LedgerProcess(other, nats_server.url, tmp_path / "own.log", "--durable", "ledger-other").start()
        wait_holding_lock(own)
        emit_payload_steps(nats_server.url, tmp_path / "spool", "both", 50)
        assert wait_for_count(root, "select count(*) from steps", 50, timeout=60) == 50
        assert wait_for_count(other, "select count(*) from steps", 50, timeout=60) == 50
        own.kill()
    finally:
        first.kill()


async def _write_without_ack(root, url, durable="ledger") -> int:
    """A ledger instance that fetches a batch, writes and commits it, and dies before acking (what SIGKILL
    does there; one that died before its commit would leave files that no reader reads)."""
    nc = await bus.connect(url)
    try:
        js = nc.jetstream()
        await bus.ensure_consumer(js, durable, owner=service.consumer_owner(root))
        puller = await bus.Puller(nc, STREAM, durable).start()
        msgs = await puller.fetch(2_000, timeout=2)
        ledger = service.Ledger(root)
        ledger.write(ledger.decode([(m.subject, m.data, consumers.stream_seq(m)) for m in msgs]))
        ledger.commit()
        return ledger.counters.stored
    finally:
        await nc.close()


def test_two_ledgers_on_one_root_without_the_lock_store_twice_and_verify_repair_mends_it(tmp_path, nats_server, root):
    sent = emit_payload_steps(nats_server.url, tmp_path / "spool", "twice", 1_000)
    # The second instance is up (its index of what is stored loaded) while the first writes and dies.
    survivor = service.Ledger(root)
    survivor.index.load_run("twice")  # (its stored set of the run is loaded per run, when first needed: now)
    written = asyncio.run(_write_without_ack(root, nats_server.url))
    assert written == sent

    # The survivor is given what the dead one left unacked, and writes it again: the bug the lock prevents.
    stop = asyncio.Event()
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_until_complete,
                         args=(service.serve_ledger(survivor, nats_server.url, stop, 2_000, until_stored=sent),), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive()
    assert reader(root).execute("select count(*), count(distinct event_id) from steps_all").fetchone() == (2_000, 1_000)

    report = cli("verify", "--root", str(root))
    assert report.returncode == 1
    assert "twice:worker-0:0:0: stored 2 times" in report.stdout

    repaired = cli("verify", "--repair", "--root", str(root))
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert f"removed {sent} duplicate rows of {sent} events" in repaired.stdout
    assert reader(root).execute("select count(*), count(distinct event_id) from steps_all").fetchone() == (1_000, 1_000)
    assert cli("verify", "--root", str(root)).returncode == 0


def test_repair_refuses_while_a_ledger_serves_the_root(tmp_path, nats_server, root):
    lp = LedgerProcess(root, nats_server.url, tmp_path / "ledger.log").start()
    try:
        wait_holding_lock(lp)
        out = cli("verify", "--repair", "--root", str(root))
        assert out.returncode == 2 and f"pid {lp.proc.pid}" in out.stderr
    finally:
        lp.kill()


def test_two_operators_sigkilling_and_restarting_ledgers_store_each_event_once(tmp_path, nats_server, root):
    """8 runs x 2,000 steps while two ledger processes are started on one root, and the serving one is
    SIGKILLed twice mid-stream and restarted: the spare is refused until the holder dies."""
    rng = random.Random(21)
    a = LedgerProcess(root, nats_server.url, tmp_path / "a.log").start()
    b = LedgerProcess(root, nats_server.url, tmp_path / "b.log")
    try:
        wait_holding_lock(a)
        producers = [start_producer(nats_server.url, tmp_path / "spool", f"run-{i}", "worker-0", 2_000, rate=400)
                     for i in range(8)]
        refused = 0
        serving, spare = a, b
        for _ in range(2):
            spare.start()
            assert spare.proc.wait(60) == 2  # the root is served: refused, in one line
            refused += 1
            time.sleep(rng.uniform(0.2, 1.0))
            serving.kill()
            spare.start()
            wait_holding_lock(spare, timeout=20)
            serving, spare = spare, serving
        for p in producers:
            assert p.wait(180) == 0, p.stderr.read()
        assert wait_for_count(root, "select count(*) from steps_all", 16_000) == 16_000
        assert refused == 2
        assert reader(root).execute("select count(*), count(distinct event_id) from steps_all").fetchone() == (16_000, 16_000)
        assert cli("verify", "--root", str(root)).returncode == 0
    finally:
        a.kill()
        b.kill()
