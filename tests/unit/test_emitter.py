"""The Emitter's own bookkeeping, without a server: what goes in each message, and the acked bound."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runledger.ledger.contract.events import EvalCompleted, InvalidEvent, StepCompleted
from runledger.ledger.contract.validation import check_envelope
from runledger.ledger.emit import publisher as pub_mod
from runledger.ledger.emit.emitter import Emitter, SpoolFull
from runledger.ledger.emit.publisher import Publisher
from support.properties import examples

NO_SERVER = "nats://127.0.0.1:1"  # never connected to
KINDS = {"step": {"loss": 1.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 8, "step_time_s": 0.1},
         "eval": {"loss": 2.0}}
EVENTS = {"step": StepCompleted(**KINDS["step"]), "eval": EvalCompleted(**KINDS["eval"])}


@settings(max_examples=examples(25), deadline=None)
@given(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=300), st.integers(0, 2**32), st.integers(1, 64),
       st.integers(100, 20_000))
def test_messages_and_acks_in_any_order_account_for_every_event(tmp_path_factory, kinds, seed, max_batch, max_bytes):
    """Mixed kinds; messages acked in a random order, some twice (sent again after a timeout):
    each message holds one kind in seq order, and at the end every event is acked exactly once."""
    rng = random.Random(seed)
    saved = pub_mod.MAX_BATCH_EVENTS, pub_mod.MAX_BATCH_BYTES, Publisher._thread_main
    pub_mod.MAX_BATCH_EVENTS, pub_mod.MAX_BATCH_BYTES = max_batch, max_bytes
    Publisher._thread_main = lambda self: self.stopped.set()  # no publisher: this test takes and acks
    em = Emitter("run-1", "worker-0", 0, NO_SERVER, tmp_path_factory.mktemp("spool"), batch=True)
    try:
        for k in kinds:
            em.emit(EVENTS[k], step=None)
        messages = []
        while em.spool.pending:
            for items in em.publisher.take():
                assert len({i.kind for i in items}) == 1 and len(items) <= max_batch
                assert len(items) == 1 or sum(len(i.data) for i in items) < max_bytes
                assert [i.seq for i in items] == sorted(i.seq for i in items)
                messages.append(items)
        assert sorted(i.seq for m in messages for i in m) == list(range(len(kinds)))
        order = messages + rng.sample(messages, len(messages) // 3)  # some acked twice
        rng.shuffle(order)
        for items in order:
            em.spool.mark_acked(items)
        assert em.spool.acked_upto == len(kinds) and not em.spool.acked
        assert em.spool.unacked_bytes == 0 and em.pending() == 0
    finally:
        pub_mod.MAX_BATCH_EVENTS, pub_mod.MAX_BATCH_BYTES, Publisher._thread_main = saved
        em.close(0.01)


STEP = KINDS["step"]
STEP_EVENT = EVENTS["step"]


@pytest.fixture(autouse=True)
def no_heads(monkeypatch):
    """The chain's mechanics, event by event: no signed head at close (heads: tests/unit/test_chain_heads.py)."""
    from runledger.ledger.tlog import chainheads

    monkeypatch.setenv(chainheads.HEADS_ENV, "off")


@pytest.fixture
def no_publisher(monkeypatch):
    """Emitters whose publisher thread stops at once: events stay in the spool, close() is quick."""
    monkeypatch.setattr(Publisher, "_thread_main", lambda self: self.stopped.set())


def spooled(em: Emitter) -> list[bytes]:
    return [line for seg in sorted(em.dir.glob("seg-*.jsonl")) for line in seg.read_bytes().splitlines()]


def test_emit_many_spools_each_event_on_the_chain_that_emit_continues(tmp_path, no_publisher):
    em = Emitter("run-1", "worker-0", 0, NO_SERVER, tmp_path)
    ids = [em.emit(STEP_EVENT, step=0), em.emit_dict("step", STEP, step=1)]  # typed, or the dict form
    ids += em.emit_many([STEP_EVENT] * 5, steps=[2, 3, 4, 5, 6])
    ids.append(em.emit(EVENTS["eval"]))
    em.close(0.01)
    lines = spooled(em)
    envs = [json.loads(line) for line in lines]
    assert [e["seq"] for e in envs] == list(range(8)) and [e["event_id"] for e in envs] == ids
    assert [e["prev_hash"] for e in envs] == ["", *(e["hash"] for e in envs[:-1])]
    assert [e["step"] for e in envs] == [*range(7), None]
    for env in envs:
        check_envelope(env)
    assert [(i.seq, i.data) for i in em.spool.pending] == [(e["seq"], line) for e, line in zip(envs, lines)]  # to publish
    assert em.spool.unacked_bytes == sum(map(len, lines))  # what SpoolFull counts

    reopened = Emitter("run-1", "worker-0", 0, NO_SERVER, tmp_path)  # a restarted producer
    assert (reopened.next_seq, reopened.pending(), reopened.spool.unacked_bytes) == (8, 8, em.spool.unacked_bytes)
    reopened.emit_dicts("step", [STEP] * 2)
    reopened.close(0.01)
    more = [json.loads(line) for line in spooled(reopened)[8:]]
    assert [e["seq"] for e in more] == [8, 9] and more[0]["prev_hash"] == envs[-1]["hash"]


@pytest.mark.parametrize("payloads, max_spool_bytes, error", [
    ([STEP, {**STEP, "tokens": -1}, STEP], 1 << 20, InvalidEvent),
    ([STEP] * 20, 3_000, SpoolFull),  # ~350 bytes an event
])
def test_emit_many_refused_spools_none_of_its_events(tmp_path, no_publisher, payloads, max_spool_bytes, error):
    em = Emitter("run-1", "worker-0", 0, NO_SERVER, tmp_path, max_spool_bytes=max_spool_bytes)
    em.emit(STEP_EVENT)
    before = spooled(em)
    with pytest.raises(error):
        em.emit_dicts("step", payloads)
    assert spooled(em) == before and (em.next_seq, em.pending()) == (1, 1)
    em.emit(STEP_EVENT)  # the chain goes on from the last event spooled
    em.close(0.01)
    first, second = (json.loads(line) for line in spooled(em))
    assert second["seq"] == 1 and second["prev_hash"] == first["hash"]


def test_a_chain_the_ledger_stored_lets_go_of_its_spool_lines_and_goes_on_from_there(tmp_path, no_publisher):
    """close(stored=True) (the ledger said its tables hold the whole chain) removes the segments and
    keeps `stored` (seq and hash): reopened, the chain goes on after its last event, sending nothing again."""
    em = Emitter("run-1", "worker-0", 0, NO_SERVER, tmp_path)
    em.emit_dicts("step", [STEP] * 5)
    last_hash = json.loads(spooled(em)[-1])["hash"]
    em.spool.mark_acked(list(em.spool.pending))
    em.spool.close(stored=True)
    assert not list(em.dir.glob("seg-*")) and (em.dir / "stored").read_text().split() == ["5", last_hash]

    reopened = Emitter("run-1", "worker-0", 0, NO_SERVER, tmp_path)
    assert (reopened.next_seq, reopened.pending()) == (5, 0)
    reopened.emit_dict("step", STEP)
    reopened.close(0.01)
    (env,) = map(json.loads, spooled(reopened))
    assert (env["seq"], env["prev_hash"]) == (5, last_hash)


def test_a_prune_cut_off_after_it_recorded_the_stored_bound_loses_and_sends_again_nothing(tmp_path, no_publisher,
                                                                                           monkeypatch):
    """A crash between `stored` and the segments' removal (here the first unlink fails, as a kill would
    stop it): reopening skips the stored lines (none is sent again, none is called damaged), removes
    them, and keeps every line not stored."""
    from pathlib import Path

    from runledger.ledger.emit import spool as spool_mod

    monkeypatch.setattr(spool_mod, "SEGMENT_EVENTS", 3)  # several segments
    em = Emitter("run-1", "worker-0", 0, NO_SERVER, tmp_path)
    for _ in range(7):
        em.emit_dict("step", STEP)
    segments = sorted(em.dir.glob("seg-*"))
    assert len(segments) == 3
    em.spool.mark_acked(list(em.spool.pending))

    def killed(self, missing_ok=False):
        raise KeyboardInterrupt("killed while pruning")

    with monkeypatch.context() as m:
        m.setattr(Path, "unlink", killed)
        with pytest.raises(KeyboardInterrupt):
            em.spool.close(stored=True)
    em.spool._chain_lock.release()  # (the OS frees a killed process's lock)
    assert sorted(em.dir.glob("seg-*")) == segments and (em.dir / "stored").exists()

    reopened = Emitter("run-1", "worker-0", 0, NO_SERVER, tmp_path)
    assert (reopened.next_seq, reopened.pending()) == (7, 0)
    assert not list(reopened.dir.glob("seg-*")) and not (reopened.dir / "damaged").exists()
    reopened.emit_dict("step", STEP)  # a line not stored: kept, and sent
    reopened.close(0.01)
    again = Emitter("run-1", "worker-0", 0, NO_SERVER, tmp_path)
    assert (again.next_seq, [i.seq for i in again.spool.pending]) == (8, [7])
    again.close(0.01)
