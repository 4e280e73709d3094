"""Attacks on the ledger service (issue 33): a hostile batch, a consumer or stream removed under a
running ledger, a catalog URI that does not open. Each test acts as the attacker (a worker publishing,
whoever can reach JetStream's API, a person at the CLI) and asserts the promise that must hold.
"""

from __future__ import annotations

import asyncio
import stat
import subprocess
import time
from pathlib import Path

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from runledger.ledger.check.verify import verify
from runledger.ledger.contract import parsing
from runledger.ledger.contract.canonical import canonical_json
from runledger.ledger.contract.events import STREAM, subject_for
from runledger.ledger.emit.sealing import seal
from runledger.ledger.ingest import service
from support.postgres import Postgres
from support.processes import LedgerProcess, runledger
from support.reading import stored_ids

T0 = "2026-11-29T10:00:00.000000Z"
RUN, PRODUCER = "run-1", "worker-0"
WATCHDOG_S = 60.0  # generous: a ledger that hangs fails the test instead of hanging the suite


def step_chain(n: int, first: int = 0, prev: str = "", producer: str = PRODUCER, run_id: str = RUN) -> list[dict]:
    envs = []
    for seq in range(first, first + n):
        payload = {"loss": 1.0 + seq, "grad_norm": 0.5, "lr": 0.001, "tokens": 4096, "step_time_s": 0.1}
        env, _ = seal(run_id, producer, 0, seq, "step", payload, seq, prev, time=T0)
        envs.append(env)
        prev = env["hash"]
    return envs


def canonical_bytes(env: dict) -> bytes:
    return canonical_json(env).encode()


def array(*entries: bytes) -> bytes:
    return b"[" + b",".join(entries) + b"]"


def quarantine_rows(root: Path) -> list[tuple]:
    from runledger import queries

    return queries.connect(root).execute("select reason, event_id from quarantine order by stream_seq").fetchall()


# ------------------------------------------------------------ one broken entry costs only itself


def not_utf8(env: dict) -> bytes:
    """The entry's text with a byte that is not UTF-8 inside a string (the producer's name)."""
    return canonical_bytes(env).replace(f'"producer":"{env["producer"]}"'.encode(), b'"producer":"worker-\xff\xfe"')


def cut_short(env: dict) -> bytes:
    return canonical_bytes(env)[: len(canonical_bytes(env)) // 2]


def hostile_batches(run_id: str = RUN) -> list[tuple[bytes, list[str], int]]:
    """Batches as a worker might publish them: (bytes, the event ids that must be stored, how many
    entries must be quarantined). Each is one chain's events 0..3 plus the hostile entries."""
    e = step_chain(4, run_id=run_id)
    ids = [x["event_id"] for x in e]
    bad2 = step_chain(4, producer="worker-9", run_id=run_id)[2]
    return [
        (array(canonical_bytes(e[0]), not_utf8(bad2), canonical_bytes(e[1]), canonical_bytes(e[2]), canonical_bytes(e[3])), ids, 1),  # invalid UTF-8 inside
        (array(canonical_bytes(e[0]), canonical_bytes(e[1]), canonical_bytes(e[2]), canonical_bytes(e[3]), cut_short(bad2))[:-1], ids, 1),  # last cut short
        (array(canonical_bytes(e[0]), canonical_bytes(e[1]), cut_short(bad2), canonical_bytes(e[2]), canonical_bytes(e[3])), ids, 1),  # middle cut short
        (array(canonical_bytes(e[0]), b"17", canonical_bytes(e[1]), b'"x"', canonical_bytes(e[2]), canonical_bytes(e[3])), ids, 2),  # non-objects
        (array(canonical_bytes(e[0]), array(canonical_bytes(bad2)), canonical_bytes(e[1]), canonical_bytes(e[2]), canonical_bytes(e[3])), ids, 1),  # a nested array
        (array(canonical_bytes(e[0]), canonical_bytes(e[1]), b'{"a":"\xc0\xaf", "b": [1, {"c": "]}"}]}', canonical_bytes(e[2]), canonical_bytes(e[3])), ids, 1),
        (array(canonical_bytes(e[0]), canonical_bytes(e[1]), canonical_bytes(e[2]), canonical_bytes(e[3]), b'{"x": NaN}', b"tru"), ids, 2),
    ]


@pytest.mark.parametrize("case", range(len(hostile_batches())))
def test_a_batchs_bad_entries_cost_only_themselves(root, case):
    data, must_store, n_bad = hostile_batches()[case]
    ledger = service.Ledger(root)
    decoded = ledger.decode([(subject_for(RUN, "step"), data, 1)])
    ledger.write(decoded)
    ledger.commit()
    assert stored_ids(root) == sorted(must_store)
    rows = quarantine_rows(root)
    assert len(rows) == n_bad and all(r[0].startswith("batch entry ") for r in rows), rows
    assert verify(root).ok


def test_the_splitter_keeps_strings_escapes_and_nesting_whole():
    data = b'[ {"a": "x,]\\"}", "b": [1, [2, {"c": "["}]]} , 3 ,"\xff,"]'
    assert parsing.split_batch(data) == [b'{"a": "x,]\\"}", "b": [1, [2, {"c": "["}]]}', b"3", b'"\xff,"']
    assert parsing.split_batch(b'[{"a": 1}, {"b": ') == [b'{"a": 1}', b'{"b":']
    assert parsing.split_batch(b"[]") == [] and parsing.split_batch(b"[ ]") == []


def test_a_hole_left_by_a_bad_middle_entry_is_named_by_verify_and_recorded_in_quarantine(root):
    e = step_chain(3)
    data = array(canonical_bytes(e[0]), not_utf8(e[1]), canonical_bytes(e[2]))
    ledger = service.Ledger(root)
    ledger.write(ledger.decode([(subject_for(RUN, "step"), data, 1)]))
    ledger.commit()
    assert stored_ids(root) == sorted([e[0]["event_id"], e[2]["event_id"]])
    (reason, event_id), = quarantine_rows(root)
    assert reason.startswith("batch entry 1:") and "utf-8" in reason.lower()
    report = verify(root)
    assert not report.ok and any("gap" in p or "missing" in p or "seq 1" in p for p in report.problems), report.problems


async def publish_all(url: str, messages: list[tuple[str, bytes]]) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    from runledger.ledger.bus import jetstream as bus

    await bus.ensure_stream(js)
    for subject, data in messages:
        await js.publish(subject, data)
    await nc.close()


def test_a_worker_publishing_hostile_batches_loses_only_the_bad_entries(nats_server, root):
    """Published as a worker would, through JetStream, to a serving ledger."""
    msgs, must_store, n_bad = [], set(), 0
    for i in range(len(hostile_batches())):  # each case on its own run
        data, ids, bad = hostile_batches(f"run-{i}")[i]
        msgs.append((subject_for(f"run-{i}", "step"), data))
        must_store |= set(ids)
        n_bad += bad

    async def go():
        await publish_all(nats_server.url, msgs)
        await asyncio.wait_for(service.serve(root, nats_server.url, stop=asyncio.Event(), until_stored=len(must_store)),
                               WATCHDOG_S)

    asyncio.run(go())
    assert stored_ids(root) == sorted(must_store)
    assert len(quarantine_rows(root)) == n_bad
    assert verify(root).ok


# ------------------------------------------------------------ a catalog URI that does not open


def a_root_with_events(root: Path, catalog: str | None = None, n: int = 3) -> None:
    """A root whose ledger stored `n` events (in its sqlite catalog, or in the shared `catalog`)."""
    from runledger.ledger.ingest import partitions

    if catalog is not None:
        partitions.use_catalog(root, catalog)
    ledger = service.Ledger(root)
    ledger.write(ledger.decode([(subject_for(RUN, "step"), array(*map(canonical_bytes, step_chain(n))), 1)]))
    ledger.commit()


def refusal(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    return lines[0]


def test_serve_with_a_catalog_that_does_not_open_or_is_another_roots_leaves_the_root_as_it_was(tmp_path, root):
    other = tmp_path / "other"
    other_catalog = f"sqlite:///{tmp_path / 'other-catalog.db'}"
    a_root_with_events(other, other_catalog, n=5)  # another root's working catalog
    a_root_with_events(root)
    before = runledger("sql", "select count(*) from events", "--root", str(root), "--format", "csv")
    assert before.returncode == 0 and before.stdout.strip().endswith("3"), before.stderr
    for uri in ("bogus://x", other_catalog):
        for extra in ((), ("--partitions", "2")):
            r = runledger("ledger", "serve", "--root", str(root), "--catalog", uri, "--nats", "nats://127.0.0.1:9", *extra,
                          timeout=60)
            assert "catalog" in refusal(r)
            assert not (root / "catalog.uri").exists()
            after = runledger("sql", "select count(*) from events", "--root", str(root), "--format", "csv")
            assert (after.returncode, after.stdout) == (0, before.stdout), after.stderr


def test_a_root_whose_catalog_uri_names_another_roots_catalog_is_refused_by_readers(tmp_path, root):
    other_catalog = f"sqlite:///{tmp_path / 'other-catalog.db'}"
    a_root_with_events(tmp_path / "other", other_catalog, n=5)
    a_root_with_events(root)
    (root / "catalog.uri").write_text(other_catalog + "\n")  # edited by hand, or by a serve that failed before the fix
    assert "catalog" in refusal(runledger("sql", "select count(*) from events", "--root", str(root)))
    (root / "catalog.uri").write_text("bogus://x\n")
    assert "catalog" in refusal(runledger("sql", "select count(*) from events", "--root", str(root)))


def test_a_catalog_uri_holding_a_password_is_written_for_its_user_only(root):
    from runledger.ledger.ingest import partitions

    pg = Postgres()
    pg.start()
    try:
        uri = pg.uri.replace("postgres@", "postgres:s3cret@")  # (trust authentication: any password is taken)
        partitions.use_catalog(root, uri)
        assert stat.S_IMODE((root / "catalog.uri").stat().st_mode) == 0o600
        assert (root / "catalog.uri").read_text().strip() == uri
    finally:
        pg.stop()


# ------------------------------------------------------------ the consumer or the stream removed


async def flow(url: str, envs: list[dict], every: int = 50) -> None:
    """Publish `envs` one message each, as a producer does, yielding now and then (events flowing)."""
    from runledger.ledger.bus import jetstream as bus

    nc = await nats.connect(url)
    js = nc.jetstream()
    await bus.ensure_stream(js)
    for i, env in enumerate(envs):
        await js.publish(subject_for(env["run_id"], env["kind"]), canonical_bytes(env))
        if i % every == 0:
            await asyncio.sleep(0.01)
    await nc.close()


def count_exactly_once(root: Path, expected: int, timeout: float = WATCHDOG_S) -> None:
    """Every event stored exactly once: the count reaches `expected` and no event_id is there twice."""
    from runledger import queries

    deadline = time.monotonic() + timeout
    n = None
    while time.monotonic() < deadline:
        n = queries.connect(root).execute("select count(*), count(distinct event_id) from events").fetchone()
        if n[0] >= expected:
            break
        time.sleep(0.3)
    time.sleep(1.0)  # (anything stored twice would land now)
    n = queries.connect(root).execute("select count(*), count(distinct event_id) from events").fetchone()
    assert n == (expected, expected), n


async def delete_consumer(js) -> None:
    await js.delete_consumer(STREAM, service.DURABLE)


async def consumer_from_now_on(js) -> None:
    """Re-created by someone else so that it delivers only what comes next."""
    await js.delete_consumer(STREAM, service.DURABLE)
    await js.add_consumer(STREAM, ConsumerConfig(durable_name=service.DURABLE, deliver_policy=DeliverPolicy.NEW,
                                                 ack_policy=AckPolicy.EXPLICIT))


async def consumer_past_what_is_stored(js) -> None:
    """Re-created by someone else starting past the stream's end: as if everything had been acked."""
    last = (await js.stream_info(STREAM)).state.last_seq
    await js.delete_consumer(STREAM, service.DURABLE)
    await js.add_consumer(STREAM, ConsumerConfig(durable_name=service.DURABLE, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                                 opt_start_seq=last + 1, ack_policy=AckPolicy.EXPLICIT))


@pytest.mark.parametrize("attack", [delete_consumer, consumer_from_now_on, consumer_past_what_is_stored])
def test_a_consumer_deleted_or_re_created_under_a_serving_ledger_is_made_again_from_its_position(
        tmp_path, nats_server, root, attack):
    envs = step_chain(3000)
    lp = LedgerProcess(root, nats_server.url, tmp_path / "ledger.log").start()
    try:
        async def go():
            producer = asyncio.create_task(flow(nats_server.url, envs))
            nc = await nats.connect(nats_server.url)
            js = nc.jetstream()
            for _ in range(2):  # twice while events flow
                while True:  # (once the ledger has bound its consumer and taken some)
                    try:
                        if (await js.consumer_info(STREAM, service.DURABLE)).ack_floor.stream_seq > 100:
                            break
                    except Exception:
                        pass
                    await asyncio.sleep(0.05)
                await attack(js)
                await asyncio.sleep(service.WATCH_EVERY_S * 2)
            await asyncio.wait_for(producer, WATCHDOG_S)
            await nc.close()

        asyncio.run(asyncio.wait_for(go(), WATCHDOG_S))
        count_exactly_once(root, len(envs))
        assert lp.proc.poll() is None
    finally:
        lp.kill()
    log_text = (tmp_path / "ledger.log").read_text()
    assert "making it again from what root" in log_text, log_text[-3000:]
    assert verify(root).ok


async def purge(js) -> None:
    await js.purge_stream(STREAM)


async def delete_and_recreate_stream(js) -> None:
    from runledger.ledger.bus import jetstream as bus

    await js.delete_stream(STREAM)
    await bus.ensure_stream(js)


@pytest.mark.parametrize("attack", [purge, delete_and_recreate_stream])
def test_a_stream_purged_or_re_created_stops_the_ledger_with_one_line_and_it_stays_stopped(
        tmp_path, nats_server, root, attack):
    lp = LedgerProcess(root, nats_server.url, tmp_path / "ledger.log").start()
    try:
        async def go():
            nc = await nats.connect(nats_server.url)
            js = nc.jetstream()
            producer = asyncio.create_task(flow(nats_server.url, step_chain(20_000), every=1000))
            while True:  # (once the ledger has bound its consumer and taken some)
                try:
                    if (await js.consumer_info(STREAM, service.DURABLE)).ack_floor.stream_seq > 100:
                        break
                except Exception:
                    pass
                await asyncio.sleep(0.05)
            await attack(js)
            await nc.close()
            try:
                await asyncio.wait_for(producer, WATCHDOG_S)
            except Exception:
                pass  # (a publish while the stream is deleted fails: the attack's doing)

        asyncio.run(asyncio.wait_for(go(), WATCHDOG_S))
        code = lp.proc.wait(WATCHDOG_S)
    finally:
        lp.kill()
    last = (tmp_path / "ledger.log").read_text().strip().splitlines()[-1]
    assert code == 2 and last.startswith("runledger ledger: ") and "stream RUNLEDGER" in last, last
    again = runledger("ledger", "serve", "--root", str(root), "--nats", nats_server.url, timeout=60)
    assert "stream RUNLEDGER" in refusal(again)


# ------------------------------------------------------------ the same, on a partitioned ledger

K = 2


def runs_envs(n_runs: int = 4, per_run: int = 600) -> list[dict]:
    """Events of `n_runs` runs (over both partitions), interleaved as producers would send them."""
    chains = [step_chain(per_run, run_id=f"run-{r}") for r in range(n_runs)]
    return [c[i] for i in range(per_run) for c in chains]


async def until_partitions_bound(js) -> None:
    """Until both partitions' consumers are there (made, or made again) and have taken something."""
    from runledger.ledger.ingest.partitions import Part, parts_stream

    while True:
        try:
            infos = [await js.consumer_info(parts_stream(K), Part(K, p).durable) for p in range(K)]
            if all(i.delivered.consumer_seq > 0 for i in infos):
                return
        except Exception:
            pass
        await asyncio.sleep(0.05)


async def delete_part_consumers(js) -> None:
    from runledger.ledger.ingest.partitions import Part, parts_stream

    for p in range(K):
        await js.delete_consumer(parts_stream(K), Part(K, p).durable)


def test_a_partitions_consumers_deleted_are_made_again(tmp_path, nats_server, root):
    """(Made anew to deliver only new messages, or another partition's, is refused by the server on
    a work-queue stream.)"""
    attack = delete_part_consumers
    envs = runs_envs(per_run=2000)
    lp = LedgerProcess(root, nats_server.url, tmp_path / "ledger.log", "--partitions", str(K)).start()
    try:
        async def go():
            nc = await nats.connect(nats_server.url)
            js = nc.jetstream()
            producer = asyncio.create_task(flow(nats_server.url, envs, every=10))
            for _ in range(2):
                await until_partitions_bound(js)
                await attack(js)
                await asyncio.sleep(service.WATCH_EVERY_S * 2)
            await asyncio.wait_for(producer, WATCHDOG_S)
            await nc.close()

        asyncio.run(asyncio.wait_for(go(), WATCHDOG_S))
        count_exactly_once(root, len(envs))
        assert lp.proc.poll() is None
    finally:
        lp.kill()
    log_text = (tmp_path / "ledger.log").read_text()
    assert "making it again from what root" in log_text, log_text[-3000:]


async def delete_parts_stream(js) -> None:
    from runledger.ledger.ingest.partitions import parts_stream

    await js.delete_stream(parts_stream(K))


@pytest.mark.parametrize("attack", [purge, delete_parts_stream])
def test_a_partitioned_ledgers_stream_purged_or_deleted_stops_it_with_one_line(tmp_path, nats_server, root, attack):
    lp = LedgerProcess(root, nats_server.url, tmp_path / "ledger.log", "--partitions", str(K)).start()
    try:
        async def go():
            nc = await nats.connect(nats_server.url)
            js = nc.jetstream()
            producer = asyncio.create_task(flow(nats_server.url, runs_envs(per_run=3000), every=1000))
            await until_partitions_bound(js)
            await attack(js)
            await nc.close()
            try:
                await asyncio.wait_for(producer, WATCHDOG_S)
            except Exception:
                pass

        asyncio.run(asyncio.wait_for(go(), WATCHDOG_S))
        code = lp.proc.wait(WATCHDOG_S)
    finally:
        lp.kill()
    last = (tmp_path / "ledger.log").read_text().strip().splitlines()[-1]
    assert code == 2 and last.startswith("runledger ledger: ") and "stream RUNLEDGER" in last, last
    again = runledger("ledger", "serve", "--root", str(root), "--nats", nats_server.url, "--partitions", str(K), timeout=60)
    assert "stream RUNLEDGER" in refusal(again)
