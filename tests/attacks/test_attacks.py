"""Attacks on the ledger, each written as the attacker: publish as a role of `nats up --secure`, or
hand the ledger a hostile message, then assert the promise: the ledger stays up, every valid event is
stored once, what is refused is quarantined with its reason, and no role reaches another's consumer.

(The CLI, SQL and secrets attacks are in test_attacks_cli.py; Msg-Id hijacking and clashing
producers in test_one_chain.py; two ledgers on one root in test_one_writer.py.)
"""

from __future__ import annotations

import asyncio
import datetime
import json
import shutil

import nats
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.js.api import ConsumerConfig, DeliverPolicy

from runledger import queries
from runledger.ledger.bus import jetstream as bus
from runledger.ledger.bus.natsserver import NatsServer
from runledger.ledger.contract.canonical import canonical_json, event_hash
from runledger.ledger.contract.events import STREAM, InvalidEvent, make_event_id
from runledger.ledger.emit.emitter import Emitter
from runledger.ledger.emit.sealing import seal
from runledger.ledger.ingest import service
from runledger.ledger.storage import paths
from runledger.ledger.storage.files import partition_dir
from runledger.ledger.storage.rows import StoredEvent
from runledger.tools.produce import step_payload
from support.processes import LedgerProcess, cli, runledger, wait_serving
from support.reading import reader, wait_for_count
from support.runs import rewrite_partition
from support.secure import secure_ledger, secure_server  # noqa: F401 (fixtures)
from support.webhooks import publish_raw

POISON_LOSS = 2**53 + 1  # a JSON integer in a float field that no double equals


def hand_sealed(run_id: str, producer: str, seq: int, payload: dict, prev_hash: str = "", kind: str = "step") -> dict:
    """An envelope sealed by hand, the way an attacker's own client would (no Emitter checks)."""
    env = {"event_id": make_event_id(run_id, producer, 0, seq), "run_id": run_id, "producer": producer, "attempt": 0,
           "seq": seq, "kind": kind, "time": "2026-11-29T10:00:00.000000Z", "step": seq, "schema_version": 1,
           "prev_hash": prev_hash, "payload": payload}
    env["hash"] = event_hash(env, canonical_json(payload))
    return env


def valid_chain(run_id: str, producer: str, n: int) -> list[str]:
    texts, prev = [], ""
    for i in range(n):
        env, text = seal(run_id, producer, 0, i, "step", step_payload(i), i, prev)
        texts.append(text)
        prev = env["hash"]
    return texts


def quarantine_reasons(root) -> list[str]:
    return [r for (r,) in reader(root).execute("select reason from quarantine").fetchall()]


# ---------------------------------------------------------------------------------------- crash loops


def test_a_batch_entry_nested_a_thousand_deep_is_quarantined_and_its_siblings_stored(secure_ledger):
    root, urls, ledger = secure_ledger
    deep = "[" * 1000 + "]" * 1000
    good = valid_chain("r1", "w", 3)
    body = ("[" + good[0] + "," + deep + "," + good[1] + "," + good[2] + "]").encode()
    asyncio.run(publish_raw(urls["worker-r1"], "runledger.r1.step", body))
    assert wait_for_count(root, "select count(*) from quarantine", 1, timeout=60) == 1
    assert wait_for_count(root, "select count(*) from steps where run_id = 'r1'", 3, timeout=60) == 3
    assert ledger.proc.poll() is None  # alive: it used to die here, and on every restart
    assert any(r.startswith("batch entry 1:") for r in quarantine_reasons(root))


def test_a_float_field_holding_an_integer_no_double_equals_is_quarantined(secure_ledger):
    root, urls, ledger = secure_ledger
    poison = hand_sealed("r1", "w", 0, {**step_payload(0), "loss": POISON_LOSS})
    asyncio.run(publish_raw(urls["worker-r1"], "runledger.r1.step", canonical_json(poison).encode(),
                            json.dumps([poison]).encode()))
    after = Emitter("r1", "worker-0", 0, urls["worker-r1"], root.parent / "spool")
    after.emit_dict("step", step_payload(1), step=1)
    assert after.close(60)
    assert wait_for_count(root, "select count(*) from steps where producer = 'worker-0'", 1, timeout=60) == 1
    assert ledger.proc.poll() is None
    reasons = quarantine_reasons(root)
    assert len(reasons) == 2 and all("no exact float64 value" in r for r in reasons)
    with pytest.raises(InvalidEvent, match="no exact float64"):  # and the producer side refuses it first
        Emitter("r1", "worker-1", 0, urls["worker-r1"], root.parent / "spool").emit_dict(
            "step", {**step_payload(0), "loss": POISON_LOSS})


def test_a_value_the_columns_cannot_hold_is_quarantined_not_a_crash(root):
    """Whatever slips past validation and breaks the Parquet write (here: a check bypassed by hand)
    costs its own event, never the ledger or its siblings."""
    ledger = service.Ledger(root)
    ok = hand_sealed("slip", "w", 0, step_payload(0))
    bad = hand_sealed("slip", "w", 1, {**step_payload(1), "loss": POISON_LOSS}, ok["hash"])
    decoded = service.Decoded(events=[StoredEvent(ok, canonical_json(ok["payload"]), 1),
                                      StoredEvent(bad, canonical_json(bad["payload"]), 2)])
    ledger.write_safely(decoded, [])
    ledger.commit()
    con = queries.connect(root)
    assert con.execute("select event_id from steps_all").fetchall() == [("slip:w:0:0",)]
    assert con.execute("select event_id, reason like 'cannot be stored:%' from quarantine").fetchall() == [("slip:w:0:1", True)]


def test_a_million_entry_batch_is_one_quarantine_row(secure_ledger):
    root, urls, ledger = secure_ledger
    body = b"[" + b",".join([b"{}"] * 1_000_000) + b"]"  # 3 MB
    asyncio.run(publish_raw(urls["worker-r1"], "runledger.r1.step", body))
    em = Emitter("r1", "worker-0", 0, urls["worker-r1"], root.parent / "spool")
    em.emit_dict("step", step_payload(0), step=0)
    assert em.close(60)
    assert wait_for_count(root, "select count(*) from steps where run_id = 'r1'", 1, timeout=60) == 1
    assert quarantine_reasons(root) == ["a batch of 1,000,000 entries exceeds the 10,000-entry limit"]
    assert ledger.proc.poll() is None


def test_a_message_the_disk_refuses_for_its_own_reason_is_quarantined_after_retries(tmp_path, nats_server, root):
    """Someone with file access plants a file where run `blocked`'s folder would go: writing that run
    fails (not the disk: one message's own OSError). After a few tries its message is quarantined with
    the reason; the runs beside it are stored, and the ledger is never stuck or down."""
    (root / "events" / "kind=step").mkdir(parents=True)
    (root / "events" / "kind=step" / "run_id=blocked").write_text("in the way")
    lp = LedgerProcess(root, nats_server.url, tmp_path / "ledger.log").start()
    try:
        wait_serving(lp)
        for run_id in ("blocked", "fine"):
            em = Emitter(run_id, "worker-0", 0, nats_server.url, tmp_path / "spool", confirm=False)
            em.emit_dict("step", step_payload(0), step=0)
            assert em.close(60)
        assert wait_for_count(root, "select count(*) from steps where run_id = 'fine'", 1, timeout=60) == 1
        assert wait_for_count(root, "select count(*) from quarantine", 1, timeout=60) == 1
        [reason] = quarantine_reasons(root)
        assert reason.startswith("the ledger cannot write this message:") and "run_id=blocked" in reason
        assert lp.proc.poll() is None
    finally:
        lp.kill()


# ---------------------------------------------------------------------------------------- consumers


async def _as_agent_try_the_ledgers_consumer(url: str) -> list[str]:
    errors: list[str] = []

    async def on_error(err):
        errors.append(str(err))

    nc = await nats.connect(url, error_cb=on_error)
    js = nc.jetstream()
    inbox = nc.new_inbox()
    got = []

    async def collect(msg) -> None:
        got.append(msg)

    sub = await nc.subscribe(inbox, cb=collect)
    await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.ledger", b'{"batch": 100, "expires": 500000000}', reply=inbox)
    await nc.publish(f"$JS.ACK.{STREAM}.ledger.1.1.1.0.0", b"+ACK")
    for attempt in (js.delete_consumer(STREAM, "ledger"), js.consumer_info(STREAM, "ledger"),
                    js.add_consumer(STREAM, ConsumerConfig(durable_name="ledger", deliver_policy=DeliverPolicy.NEW))):
        try:
            await asyncio.wait_for(attempt, 2)
            errors.append("ALLOWED")
        except Exception:
            pass
    await asyncio.sleep(0.5)
    await sub.unsubscribe()
    await nc.close()
    assert not got, "the agent pulled messages from the ledger's consumer"
    return errors


def test_the_agent_role_cannot_pull_ack_or_replace_the_ledgers_consumer(secure_ledger):
    root, urls, ledger = secure_ledger
    errors = asyncio.run(_as_agent_try_the_ledgers_consumer(urls["agent"]))
    assert "ALLOWED" not in errors
    assert any("permissions violation" in e.lower() for e in errors)
    em = Emitter("r2", "worker-0", 0, urls["worker-r2"], root.parent / "spool")
    for i in range(20):
        em.emit_dict("step", step_payload(i), step=i)
    assert em.close(60)
    assert wait_for_count(root, "select count(*) from steps where run_id = 'r2'", 20, timeout=60) == 20
    assert ledger.proc.poll() is None


def test_a_consumer_recreated_to_skip_events_makes_the_ledger_refuse_to_start(tmp_path, nats_server, root):
    """Someone with the consumer API (no permissions on this server) replaces the ledger's consumer,
    metadata copied, with deliver_policy=new while the ledger is down: events in between would be
    skipped for good. The ledger refuses to start, loudly."""
    lp = LedgerProcess(root, nats_server.url, tmp_path / "ledger.log").start()
    wait_serving(lp)
    with Emitter("skip", "worker-0", 0, nats_server.url, tmp_path / "spool", confirm=False) as em:
        em.emit_dict("step", step_payload(0), step=0)
    assert wait_for_count(root, "select count(*) from steps", 1, timeout=60) == 1
    lp.terminate()
    with Emitter("skip", "worker-0", 1, nats_server.url, tmp_path / "spool", confirm=False) as em:
        for i in range(10):
            em.emit_dict("step", step_payload(i), step=i)  # published while the ledger is down

    async def replace():
        nc = await bus.connect(nats_server.url)
        js = nc.jetstream()
        info = await js.consumer_info(STREAM, "ledger")
        await js.delete_consumer(STREAM, "ledger")
        await js.add_consumer(STREAM, ConsumerConfig(durable_name="ledger", deliver_policy=DeliverPolicy.NEW,
                                                     ack_policy=info.config.ack_policy, metadata=info.config.metadata,
                                                     filter_subject=info.config.filter_subject))
        await nc.close()

    asyncio.run(replace())
    out = runledger("ledger", "serve", "--root", str(root), "--nats", nats_server.url, timeout=60)
    assert out.returncode == 2
    refusal = out.stderr.strip().splitlines()[-1]
    assert "consumer 'ledger' delivers from 'new'" in refusal and "refusing to start" in refusal


# ---------------------------------------------------------------------------------------- fuzz

_SAFE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
_ODD_TEXT = st.sampled_from(['"\\ud800"', '"\\udfff x"', '"\\u0000\\u001b[31m"', '"\u202e\u0645\U0001f600"', '"\\/"'])
_NUMBER = st.one_of(st.integers(-(10**30), 10**30).map(str), st.sampled_from(["1e400", "-1e400", "1e-400", "2.5e308",
                                                                            "9007199254740993", "1E2", "-0", "0.1e1"]))


def _deep(n: int) -> str:
    return "[" * n + "]" * n


@st.composite
def _poison(draw) -> str:
    """One hostile JSON text: deep, huge numbers, duplicate keys, odd unicode, or a near-valid envelope."""
    kind = draw(st.sampled_from(["deep", "deep_obj", "number", "dupkey", "odd", "loss", "junk"]))
    if kind == "deep":
        return _deep(draw(st.integers(200, 1100)))
    if kind == "deep_obj":
        n = draw(st.integers(200, 1100))
        return '{"a":' * n + "1" + "}" * n
    if kind == "number":
        return '{"payload": {"loss": %s}, "x": %s}' % (draw(_NUMBER), draw(_NUMBER))
    if kind == "dupkey":
        return '{"run_id": "a", "run_id": "b", "k": {"x": 1, "x": 2}}'
    if kind == "odd":
        return '{%s: %s}' % (json.dumps(draw(_SAFE), ensure_ascii=draw(st.booleans())), draw(_ODD_TEXT))
    if kind == "loss":
        return canonical_json(hand_sealed("fz", "evil", draw(st.integers(0, 3)), {**step_payload(0), "loss": POISON_LOSS}))
    return draw(st.sampled_from(["null", "1", '"s"', "[]", "{}", "true"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_hostile_messages_never_stop_the_ledger_and_valid_events_are_stored_once(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("fuzz")
    ledger = service.Ledger(root)
    producer = "p"
    good = valid_chain("fz", producer, data.draw(st.integers(1, 4)))
    poison = data.draw(st.lists(_poison(), min_size=1, max_size=3))
    batched = data.draw(st.booleans())
    if batched:
        entries = data.draw(st.permutations(good + poison))
        messages = [("runledger.fz.step", ("[" + ",".join(entries) + "]").encode(), 1)]
    else:
        texts = data.draw(st.permutations(good + poison))
        messages = [("runledger.fz.step", t.encode("utf-8", "surrogatepass"), i + 1) for i, t in enumerate(texts)]
    ledger.write_safely(ledger.decode(messages), messages)  # what serve does; nothing may escape it but OSError
    ledger.commit()
    ledger.write_safely(ledger.decode(messages), messages)  # and the same again (a redelivery): stored once
    ledger.commit()
    con = queries.connect(root)
    stored = con.execute("select count(*), count(distinct event_id) from steps_all where producer = 'p'").fetchone()
    assert stored == (len(good), len(good))
    assert con.execute("select count(*) from steps_all where producer = 'evil'").fetchone()[0] == 0
    assert con.execute("select count(*) from quarantine").fetchone()[0] >= 1


# ---------------------------------------------------------------------------------------- stored files
# The attacker edits the stored files; the promise: `verify` exits 1 and names what was done.


@pytest.fixture(scope="module")
def served_root(tmp_path_factory):
    """A root written by a real ledger: run `tr` with chains worker-0 (30 steps) and worker-1 (10), run
    `other` with worker-0 (5). The ledger and the server are stopped before the attacks."""
    base = tmp_path_factory.mktemp("served")
    root = base / "root"
    server = NatsServer(base / "nats").start()
    lp = LedgerProcess(root, server.url, base / "ledger.log").start()
    try:
        wait_serving(lp)
        for run_id, producer, n in (("tr", "worker-0", 30), ("tr", "worker-1", 10), ("other", "worker-0", 5)):
            with Emitter(run_id, producer, 0, server.url, base / "spool") as em:
                for i in range(n):
                    em.emit_dict("step", step_payload(i), step=i)
        assert wait_for_count(root, "select count(*) from steps_all", 45, timeout=60) == 45
        assert lp.terminate() == 0
    finally:
        lp.kill()
        server.stop()
    assert service_verify(root).ok
    return root


def service_verify(root):
    from runledger.ledger.check.verify import verify
    return verify(root)


@pytest.fixture
def attacked(served_root, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(served_root, root)
    return root


# The served chains are a worker's: with signed heads on, each also holds the `chain_head` sealed at its close
# (seq 30 of tr:worker-0:0), stored in its own kind's files. An attacker who cuts a chain cuts every kind of it.
CHAIN_KINDS = ("step", "chain_head")


def cut(root, run_id: str, keep) -> None:
    """Rewrite every file of the run's chains (each kind a chain holds) with the rows `keep(row)` accepts."""
    for kind in CHAIN_KINDS:
        rewrite_partition(root, kind, run_id, keep)


def last_seq(root, run_id: str, producer: str) -> int:
    """The seq the ledger stored the chain (run_id, producer, 0) up to, read before an attack."""
    return reader(root).execute("select max(seq) from events where run_id = ? and producer = ? and attempt = 0",
                                [run_id, producer]).fetchone()[0]


def test_a_chain_cut_short_is_found_even_in_a_self_consistent_file(attacked):
    stored = last_seq(attacked, "tr", "worker-0")
    assert stored >= 29  # its 30 steps (and its head)
    cut(attacked, "tr", lambda r: not (r["producer"] == "worker-0" and r["seq"] >= 27))
    out = cli("verify", "--root", str(attacked))
    assert out.returncode == 1
    assert (f"chain tr:worker-0:0: the ledger stored it up to seq {stored}, but it ends at seq 26 here (cut short?)"
            in out.stdout)


def test_a_producer_removed_whole_is_found(attacked):
    stored = last_seq(attacked, "tr", "worker-1")
    cut(attacked, "tr", lambda r: r["producer"] != "worker-1")
    problems = service_verify(attacked).problems
    assert problems[-1] == f"chain tr:worker-1:0: the ledger stored it up to seq {stored}, but none of it is here (deleted?)"
    assert all("the table's manifest says" in p for p in problems[:-1])  # (rewritten in place: fewer rows than committed)


def test_a_run_deleted_whole_is_found(attacked):
    stored = last_seq(attacked, "other", "worker-0")
    files = [f for kind in CHAIN_KINDS for f in paths.event_files(attacked, kind, "other")]
    for kind in CHAIN_KINDS:
        shutil.rmtree(partition_dir(attacked, kind, "other"), ignore_errors=True)  # (no chain_head files: heads off)
    problems = service_verify(attacked).problems
    assert sorted(problems[:-1]) == sorted(f"{f}: in the tables' snapshot, but not on disk (deleted?)" for f in files)
    assert problems[-1] == f"chain other:worker-0:0: the ledger stored it up to seq {stored}, but none of it is here (deleted?)"


def test_a_heads_record_removed_is_found(attacked):
    (attacked / "heads" / "run_id=other.json").unlink()
    assert any("run other: events are stored but no chain heads are recorded" in p
               for p in service_verify(attacked).problems)
    shutil.rmtree(attacked / "heads")
    assert any("no chain heads recorded" in p for p in service_verify(attacked).problems)


def test_a_ledger_restarted_on_a_cut_root_keeps_the_head_and_says_so(attacked, caplog):
    """Said when the run's stored events are first loaded (its next message: the index is lazy)."""
    stored = last_seq(attacked, "tr", "worker-0")
    cut(attacked, "tr", lambda r: not (r["producer"] == "worker-0" and r["seq"] >= 20))
    with caplog.at_level("ERROR"):
        service.Ledger(attacked).index.load_run("tr")
    assert any(f"tr:worker-0:0: the ledger stored it up to seq {stored}" in r.message for r in caplog.records)
    assert any("ends at seq 19" in p for p in service_verify(attacked).problems)  # the head was not lowered


def test_a_planted_file_outside_the_layout_is_read_by_no_view_and_named_by_verify(attacked):
    """A file of forged rows for run tr, under a folder the views' glob might once have matched."""
    events = reader(attacked).execute("select count(*) from events where run_id = 'tr'").fetchone()  # (steps, heads)
    part = partition_dir(attacked, "step", "tr")
    table = pq.read_table(sorted(part.glob("*.parquet"))[0])
    stray = attacked / "events" / "kind=step" / "zz" / "part-1.parquet"
    stray.parent.mkdir()
    pq.write_table(table.slice(0, 3), stray)
    con = queries.connect(attacked)
    assert con.execute("select count(*) from steps_all where run_id = 'tr'").fetchone() == (40,)
    assert con.execute("select count(*) from events where run_id = 'tr'").fetchone() == events
    problems = service_verify(attacked).problems
    assert problems == [f"{stray}: a stray Parquet file, outside the ledger's layout (planted?)"]


def _shift(column: str, by):
    def change(table: pa.Table) -> pa.Table:
        i = table.schema.get_field_index(column)
        moved = pc.add(table.column(column), pa.scalar(by, table.schema.field(column).type if column == "stream_seq"
                                                        else pa.duration("us")))
        return table.set_column(i, table.schema.field(column), moved)
    return change


@pytest.mark.parametrize("column, by", [("stream_seq", 1000), ("ingested_at", datetime.timedelta(hours=-1))])
def test_a_ledger_column_changed_is_found(attacked, column, by):
    """stream_seq (what `replay --as-of-seq` cuts at) or ingested_at, changed in place, the file's
    metadata kept as it was."""
    rewrite_partition(attacked, "step", "tr", lambda r: True, _shift(column, by), fresh_digest=False)
    problems = service_verify(attacked).problems
    files = paths.event_files(attacked, "step", "tr")
    assert len(problems) == len(files) and all("do not match the digest it recorded" in p for p in problems)


def test_a_ts_changed_is_found_even_with_a_fresh_digest(attacked):
    """ts drives the time-based checks; it is derived from the hashed `time`, so a changed ts is named."""
    rewrite_partition(attacked, "step", "tr", lambda r: True, _shift("ts", datetime.timedelta(minutes=30)))
    problems = service_verify(attacked).problems
    assert len(problems) == 40 and all("is not the event's time" in p for p in problems)


def test_verify_prints_the_heads_to_publish_elsewhere(attacked):
    """The heads are what holds a writer of every file to account: printed for keeping outside the root."""
    con = reader(attacked)
    events = con.execute("select count(*) from events").fetchone()[0]
    assert con.execute("select count(*) from events where kind = 'step'").fetchone()[0] == 45
    out = cli("verify", "--root", str(attacked), "--format", "json")
    assert out.returncode == 0
    summary = json.loads(out.stdout)
    assert summary["ok"] and summary["events"] == events and summary["problems"] == []
    chains = {"tr:worker-0:0": ("tr", "worker-0"), "tr:worker-1:0": ("tr", "worker-1"), "other:worker-0:0": ("other", "worker-0")}
    ends = {k: last_seq(attacked, *c) for k, c in chains.items()}  # (each chain's last step, or its closing head)
    assert ends["tr:worker-0:0"] >= 29 and ends["tr:worker-1:0"] >= 9 and ends["other:worker-0:0"] >= 4
    assert {k: v["seq"] for k, v in summary["heads"].items()} == ends
    last = con.execute("select hash from events where run_id = 'tr' and producer = 'worker-0' and seq = ?",
                       [ends["tr:worker-0:0"]]).fetchone()[0]
    assert summary["heads"]["tr:worker-0:0"]["hash"] == last


# ---------------------------------------------------------------------------------------- the free-form kinds (issue 16)


def test_a_worker_may_alert_and_log_metrics_on_its_own_run_only(secure_ledger, tmp_path):
    """A run's worker role publishes `metrics` and `alert` for its run (`runledger.log`, `runledger.alert`),
    never for another run, and still no decision."""
    root, urls, ledger = secure_ledger
    alert = {"alert_id": "a1", "agent": "main", "rule": "loss spike", "message": "loss 9.1"}
    own = Emitter("r1", "main", 0, urls["worker-r1"], tmp_path / "spool")
    own.emit_dict("metrics", {"metrics": {"val/accuracy": 0.5}}, step=0)
    own.emit_dict("alert", alert, step=0)
    assert own.close(60)
    other = Emitter("r2", "main", 0, urls["worker-r1"], tmp_path / "spool")  # r1's credentials, r2's subjects
    other.emit_dict("metrics", {"metrics": {"val/accuracy": 0.0}}, step=0)
    other.emit_dict("alert", alert, step=0)
    assert not other.close(timeout=8)
    assert {"runledger.r2.metrics", "runledger.r2.alert"} <= other.refused
    assert wait_for_count(root, "select count(*) from alerts", 1, timeout=60) == 1
    db = reader(root)
    assert db.execute("select run_id, key, value from metrics").fetchall() == [("r1", "val/accuracy", 0.5)]
    assert db.execute("select run_id from alerts").fetchall() == [("r1",)]


def test_hostile_metrics_payloads_are_quarantined_and_the_honest_ones_stored(secure_ledger):
    """What `runledger.log` refuses at the call site, a hand-made client sends anyway: a null no one
    names as non-finite, a name with a control character, one past 256 characters, more than 2,048
    names, a string value. Each is quarantined with its reason; the ledger stays up."""
    root, urls, ledger = secure_ledger
    hostile = [{"metrics": {"loss": None}}, {"metrics": {"a\nb": 1.0}}, {"metrics": {"x" * 257: 1.0}},
               {"metrics": {f"k{i}": 1.0 for i in range(2049)}}, {"metrics": {"loss": "9.1"}},
               {"metrics": {"loss": 1.0}, "nonfinite": {"loss": "nan"}}]
    bodies = [canonical_json(hand_sealed("r1", "hostile", i, p, kind="metrics")).encode() for i, p in enumerate(hostile)]
    asyncio.run(publish_raw(urls["worker-r1"], "runledger.r1.metrics", *bodies))
    honest = Emitter("r1", "main", 0, urls["worker-r1"], root.parent / "spool")
    honest.emit_dict("metrics", {"metrics": {"loss": 2.5}}, step=0)
    assert honest.close(60)
    assert wait_for_count(root, "select count(*) from quarantine", len(hostile), timeout=60) == len(hostile)
    assert ledger.proc.poll() is None
    assert reader(root).execute("select producer, key, value from metrics_all").fetchall() == [("main", "loss", 2.5)]


def test_a_metric_column_edited_in_a_stored_file_is_named_by_verify(tmp_path):
    """A DOUBLE column per name (`metrics/NAME`) beside the hashed payload: an edit to the column (with
    the ledger's digest recomputed, as an attacker who knows the format would) is found by verify."""
    from runledger.ledger.emit.sink import ParquetSink

    root = tmp_path / "root"
    with ParquetSink(root, "m1") as sink:
        sink.emit_dicts("metrics", [{"metrics": {"loss": 1.0 / (i + 1)}} for i in range(10)], list(range(10)))
    assert cli("verify", "--root", str(root)).returncode == 0

    def lower_loss(table: pa.Table) -> pa.Table:
        i = table.schema.get_field_index("metrics/loss")
        return table.set_column(i, "metrics/loss", pc.multiply(table.column(i), 0.5))

    rewrite_partition(root, "metrics", "m1", lambda r: True, lower_loss)
    out = cli("verify", "--root", str(root))
    assert out.returncode == 1 and "column metrics/loss = 0.5 but the payload says 1.0" in out.stdout
