"""Attacks on deletion, on a secure server: only the `admin` role deletes a run, and only as a person.

The promise: a run's rows leave the tables only under a tombstone the `admin` role published as a
person (`runledger delete`). A worker, an agent and notify are refused the tombstone subject by the
server; a tombstone smuggled onto a subject a worker may use, or one the admin publishes under a
worker's producer name, is quarantined; in each case every row of the run stays and `verify` names no
tombstone. The admin's own delete is recorded with its credential's user."""

from __future__ import annotations

import asyncio

import nats
import pytest

from runledger.ledger.emit.emitter import Emitter
from runledger.ledger.emit.sealing import seal
from runledger.ledger.storage import removal
from support.processes import cli, verify
from support.reading import reader, wait_for_count
from support.secure import secure, secure_server, url  # noqa: F401 (fixtures)

STEP = {"loss": 2.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 64, "step_time_s": 0.1}
LISTEN_S = 2.0  # how long a refused publisher waits for the server's permission error


def r1_steps(creds, spool, producer: str = "worker-0", n: int = 5) -> None:
    em = Emitter("r1", producer, 0, url(creds, "worker-r1"), spool)
    for step in range(n):
        em.emit_dict("step", STEP, step=step)
    assert em.close(30)


def tombstone(producer: str, subject_kind: str = "tombstone") -> tuple[str, bytes]:
    """A well-formed tombstone of every r1 step (the chain worker-0:0 up to seq 4), as `producer` would seal it."""
    payload = {"chains": [{"producer": "worker-0", "attempt": 0, "seq": 4, "hash": "0" * 64}], "events": 5,
               "by": "mallory", "authority": "os_user"}
    _, wire = seal("r1", producer, 0, 0, "tombstone", payload, None, "")
    return f"runledger.r1.{subject_kind}", wire.encode() if isinstance(wire, str) else wire


async def publish_as(attacker_url: str, subject: str, data: bytes) -> list[str]:
    """Publish one message as the attacker; the server's errors (a permission violation is one)."""
    errors: list[str] = []

    async def on_error(err):
        errors.append(str(err))

    nc = await nats.connect(attacker_url, error_cb=on_error, max_reconnect_attempts=0)
    await nc.publish(subject, data)
    await nc.flush()
    await asyncio.sleep(LISTEN_S)
    await nc.close()
    return errors


def r1_rows(root) -> int:
    """r1's steps still stored (a worker's chain also holds its signed `chain_head` events when heads are on)."""
    return reader(root).execute("select count(*) from events where run_id = 'r1' and kind = 'step'").fetchone()[0]


@pytest.mark.parametrize("attacker", ["worker-r1", "worker-r2", "agent", "notify"])
def test_no_role_but_admin_may_publish_a_tombstone(secure, tmp_path, attacker):
    root, creds = secure
    r1_steps(creds, tmp_path / "spool")
    assert wait_for_count(root, "select count(*) from events where run_id = 'r1' and kind = 'step'", 5, timeout=30) == 5
    subject, data = tombstone("cli")
    errors = asyncio.run(publish_as(url(creds, attacker), subject, data))
    assert any("permissions violation" in e.lower() for e in errors), errors
    r1_steps(creds, tmp_path / "spool-2", "worker-1")  # (later events: once stored, the ledger is past the attempt)
    assert wait_for_count(root, "select count(*) from events where run_id = 'r1' and kind = 'step'", 10, timeout=30) == 10
    assert r1_rows(root) == 10 and removal.stored_tombstones(root) == []
    rc, out = verify(root)
    assert rc == 0 and "tombstone" not in out, out


def test_a_tombstone_on_a_workers_subject_or_under_a_workers_name_is_quarantined(secure, tmp_path):
    root, creds = secure
    r1_steps(creds, tmp_path / "spool")
    smuggled = tombstone("cli", subject_kind="step")  # a subject the worker may use, another kind inside
    assert asyncio.run(publish_as(url(creds, "worker-r1"), *smuggled)) == []
    as_worker = tombstone("worker-9")  # the admin's subject, but a worker's producer name: not a person's
    assert asyncio.run(publish_as(url(creds, "admin"), *as_worker)) == []
    assert wait_for_count(root, "select count(*) from quarantine", 2, timeout=30) == 2
    reasons = [r[0] for r in reader(root).execute("select reason from quarantine order by stream_seq").fetchall()]
    assert "subject says kind 'step' but the event is a 'tombstone'" in reasons[0], reasons
    assert "a tombstone is a person's" in reasons[1], reasons
    assert r1_rows(root) == 5 and removal.stored_tombstones(root) == []


def test_the_admin_deletes_a_run_recorded_with_its_credentials_user(secure, tmp_path):
    root, creds = secure
    r1_steps(creds, tmp_path / "spool")
    other = Emitter("r2", "worker-0", 0, url(creds, "worker-r2"), tmp_path / "spool-r2")
    other.emit_dict("step", STEP, step=0)
    assert other.close(30)
    assert wait_for_count(root, "select count(*) from events where kind = 'step'", 6, timeout=30) == 6
    r = cli("delete", "r1", "--root", str(root), "--creds", str(creds / "admin.creds"), "--yes")
    assert r.returncode == 0, r.stderr
    (t,) = removal.stored_tombstones(root)
    assert (t["payload"]["by"], t["payload"]["authority"]) == ("admin", "nats_user")
    assert r1_rows(root) == 0
    assert reader(root).execute("select count(*) from events where run_id = 'r1' and kind <> 'tombstone'").fetchone()[0] == 0
    assert reader(root).execute("select count(*) from events where run_id = 'r2' and kind = 'step'").fetchone()[0] == 1
    rc, out = verify(root)
    assert rc == 0 and t["event_id"] in out, out

    refused = cli("delete", "r2", "--root", str(root), "--creds", str(creds / "worker-r2.creds"), "--yes",
                  "--timeout", "5")
    assert refused.returncode != 0
    assert reader(root).execute("select count(*) from events where run_id = 'r2' and kind = 'step'").fetchone()[0] == 1


def test_a_deleted_runs_events_resent_by_its_worker_stay_deleted(secure, tmp_path):
    """After the admin's delete, the run's own worker credential sends the deleted events again, verbatim
    (as a replayed spool or a captured message would, with no message id the server could dedupe on):
    none is stored again and none lands in quarantine (which would keep the deleted content)."""
    from runledger.ledger.contract.canonical import envelope_text
    from runledger.ledger.contract.events import subject_for
    from runledger.ledger.storage import reads
    from runledger.ledger.storage.rows import ENVELOPE_SCHEMA

    root, creds = secure
    r1_steps(creds, tmp_path / "spool")
    assert wait_for_count(root, "select count(*) from events where run_id = 'r1' and kind = 'step'", 5, timeout=30) == 5
    stored = reads.read_events(root, columns=[n for n, _ in ENVELOPE_SCHEMA if n not in ("ts", "ingested_at", "stream_seq")])
    resend = [(subject_for(e["run_id"], e["kind"]), envelope_text(e, e.pop("payload"), with_hash=True).encode())
              for e in stored.to_pylist() if e["run_id"] == "r1"]
    assert len(resend) >= 5
    r = cli("delete", "r1", "--root", str(root), "--creds", str(creds / "admin.creds"), "--yes")
    assert r.returncode == 0, r.stderr
    assert r1_rows(root) == 0

    async def send_again() -> list[str]:
        errors: list[str] = []

        async def on_error(err):
            errors.append(str(err))

        nc = await nats.connect(url(creds, "worker-r1"), error_cb=on_error, max_reconnect_attempts=0)
        for subject, data in resend:  # (into the stream as any publish; the later r2 event orders after them)
            await nc.publish(subject, data)
        await nc.flush()
        await asyncio.sleep(LISTEN_S)
        await nc.close()
        return errors

    assert asyncio.run(send_again()) == []
    later = Emitter("r2", "worker-0", 0, url(creds, "worker-r2"), tmp_path / "spool-r2")  # stored after the resends
    later.emit_dict("step", STEP, step=0)
    assert later.close(30)
    assert wait_for_count(root, "select count(*) from events where run_id = 'r2' and kind = 'step'", 1, timeout=30) == 1
    assert reader(root).execute("select count(*) from events where run_id = 'r1' and kind <> 'tombstone'").fetchone()[0] == 0
    assert reader(root).execute("select count(*) from quarantine").fetchone()[0] == 0
    rc, out = verify(root)
    assert rc == 0, out
