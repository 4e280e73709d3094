"""The ledger end to end with a real nats-server: nothing lost, nothing doubled, whatever dies.

Each test: start real processes (nats-server, `runledger ledger serve`, producers), break something,
then ask the ledger (DuckDB views) and `runledger verify` what was stored. The ledger or nats-server
SIGKILLed during a stream is the chaos run's (tests/e2e/test_chaos.py: each fault 5 times, every event
accounted for); several producers through a ledger SIGKILLed and restarted, tests/integration/test_one_writer.py.
"""

from __future__ import annotations

import asyncio
import json
import time

import nats

from runledger.ledger.bus import jetstream as bus
from runledger.ledger.contract.events import subject_for
from runledger.ledger.emit.sealing import seal
from support.processes import cli, start_producer
from support.reading import reader, wait_for_count


def step_counts(root, run_id=None) -> tuple[int, int]:
    where = f"where run_id = '{run_id}'" if run_id else ""
    return reader(root).execute(f"select count(*), count(distinct event_id) from steps {where}").fetchone()


def test_producer_killed_before_publishing_resumes_from_its_spool(tmp_path, root, nats_server, ledger_process):
    spool = tmp_path / "spool"
    dead_url = "nats://127.0.0.1:1"  # nothing listens: every event stays in the spool
    p = start_producer(dead_url, spool, "spoolrun", "worker-0", 3_000)
    deadline = time.monotonic() + 60
    while not any(spool.glob("spoolrun/worker-0/0/seg-*.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    p.kill()
    p.wait()
    spooled = sum(len(f.read_bytes().splitlines()) for f in spool.glob("spoolrun/worker-0/0/seg-*.jsonl"))
    assert spooled > 0
    ledger_process.start()
    # the same producer restarted: it publishes what the dead one spooled, then goes on to 3,000
    p = start_producer(nats_server.url, spool, "spoolrun", "worker-0", 3_000)
    assert p.wait(120) == 0, p.stderr.read()
    assert wait_for_count(root, "select count(*) from steps", 3_000) == 3_000
    assert step_counts(root, "spoolrun") == (3_000, 3_000)
    assert cli("verify", "--root", str(root)).returncode == 0


def _malformed(i: int, good_env: dict) -> tuple[str, bytes, str]:
    """The i-th malformed message: (subject, data, the reason it must be quarantined for)."""
    run = "badrun"
    env = dict(good_env)
    kind = i % 8
    if kind == 0:
        return subject_for(run, "step"), b"this is not json {" + str(i).encode(), "not JSON"
    if kind == 1:
        env["payload"] = {**env["payload"], "loss": "low"}
        return subject_for(run, "step"), json.dumps(env).encode(), "payload.loss"
    if kind == 2:
        env["kind"] = "bogus"
        return subject_for(run, "bogus"), json.dumps(env).encode(), "unknown kind"
    if kind == 3:
        env["hash"] = "0" * 64
        return subject_for(run, "step"), json.dumps(env).encode(), "hash mismatch"
    if kind == 4:
        if i % 80 == 4:  # a handful of 2 MB messages
            env["payload"] = {**env["payload"], "note": "x" * (2 << 20)}
            return subject_for(run, "step"), json.dumps(env).encode(), "exceeds"
        env["payload"] = {**env["payload"], "surprise": 1}
        return subject_for(run, "step"), json.dumps(env).encode(), "Extra inputs"
    if kind == 5:
        env["run_id"] = "../x"
        return subject_for(run, "step"), json.dumps(env).encode(), "run_id '../x' is not allowed"
    if kind == 6:
        text = json.dumps(env).replace('"loss": 1.5', '"loss": NaN')
        return subject_for(run, "step"), text.encode(), "NaN"
    return subject_for("otherrun", "step"), json.dumps(env).encode(), "subject says run"


def test_malformed_messages_are_quarantined_and_valid_ones_stored(root, nats_server, ledger_process):
    ledger_process.start()
    good = []
    prev = ""
    for s in range(1_000):
        env, text = seal("badrun", "worker-0", 0, s, "step",
                         {"loss": 1.5, "grad_norm": 1.0, "lr": 1e-3, "tokens": 64, "step_time_s": 0.1}, s, prev)
        prev = env["hash"]
        good.append((subject_for("badrun", "step"), text.encode(), env))
    template = dict(good[0][2])
    bad = [_malformed(i, template) for i in range(1_000)]

    async def send():
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        await bus.ensure_stream(js)
        for i in range(1_000):  # interleaved: valid, malformed, valid, ...
            await js.publish(good[i][0], good[i][1], headers={"Nats-Msg-Id": good[i][2]["event_id"]})
            await js.publish(bad[i][0], bad[i][1])
        await nc.close()

    asyncio.run(send())
    assert wait_for_count(root, "select count(*) from quarantine", 1_000) == 1_000
    assert wait_for_count(root, "select count(*) from steps", 1_000) == 1_000
    assert ledger_process.proc.poll() is None, "the service stopped"
    con = reader(root)
    reasons = [r[0] for r in con.execute("select reason from quarantine order by stream_seq").fetchall()]
    for (_, data, expected), reason in zip(bad, reasons):
        assert expected in reason, (expected, reason)
        assert "\n" not in reason
    raws = con.execute("select raw from quarantine order by stream_seq").fetchall()
    assert [r[0] for r in raws] == [b[1] for b in bad]  # the raw bytes are kept as received
    assert con.execute("select count(*) from quarantine where octet_length(raw) > 2000000").fetchone()[0] >= 10
    assert cli("verify", "--root", str(root)).returncode == 0
