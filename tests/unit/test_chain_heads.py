"""Signed chain heads (runledger.ledger.tlog.chainheads): an Emitter signs its chain every N events and at
close with its attempt's key, vouched for by the user's key; the check names each head that does not
check, each event a head does not cover where one should, and no head reads as a checkpoint."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from runledger.ledger.contract.validation import check_payload
from runledger.ledger.emit.emitter import Emitter
from runledger.ledger.emit.sealing import seal
from runledger.ledger.tlog import chainheads, checkpoint, note
from runledger.ledger.tlog.chainheads import Head, HeadSigner, check_chain

RUN, PRODUCER = "r1", "worker-0"


@pytest.fixture(autouse=True)
def heads_on(monkeypatch):
    monkeypatch.setenv(chainheads.HEADS_ENV, "on")  # (the default: runledger.ledger.tlog.chainheads.enabled)


def _spooled(spool: Path, attempt: int = 0) -> list[dict]:
    return [json.loads(line) for f in sorted((spool / RUN / PRODUCER / str(attempt)).glob("seg-*.jsonl"))
            for line in f.read_text().splitlines()]


def _heads(events: list[dict]) -> list[Head]:
    return [Head(e["seq"], e["prev_hash"], e["payload"]) for e in events if e["kind"] == chainheads.KIND]


def _emit(spool: Path, n: int, every: int, monkeypatch, **kw) -> list[dict]:
    monkeypatch.setenv(chainheads.EVERY_ENV, str(every))
    em = Emitter(RUN, PRODUCER, 0, None, spool, **kw)
    for i in range(n):
        em.emit_dict("metrics", {"metrics": {"x": float(i)}}, i)
        if em.spool.seq - em._head_next >= every:  # (the publisher's round does this; offline, here)
            em.sign_head()
    em.emit_dict("run_finished", {"status": "completed"})
    em.close()
    return _spooled(spool)


def test_an_emitter_signs_every_n_events_and_at_close_and_its_chain_checks(tmp_path, monkeypatch):
    events = _emit(tmp_path / "spool", 25, 10, monkeypatch)
    heads = _heads(events)
    assert [h.seq for h in heads] == [10, 21, 28]  # after 10 events, 10 more, and at close (after run_finished)
    assert "attempt_key" in heads[0].payload and all("attempt_key" not in h.payload for h in heads[1:])
    for h in heads:
        check_payload(chainheads.KIND, h.payload)  # the contract's model
    got = check_chain(RUN, PRODUCER, 0, heads, events[-1]["seq"], events[-2]["seq"])
    assert got.problems == [] and got.heads == 3 and got.covered == events[-1]["seq"]
    user = note.read_key(chainheads.user_key_file())  # made on first use, 0600, never the log's key
    assert got.user_key == user.verifier.text()
    assert stat.S_IMODE(chainheads.user_key_file().stat().st_mode) == 0o600
    assert chainheads.user_key_file().name == "producer.key"


def test_heads_off_signs_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(chainheads.HEADS_ENV, "off")
    assert _heads(_emit(tmp_path / "spool", 25, 10, monkeypatch)) == []
    monkeypatch.delenv(chainheads.HEADS_ENV)
    assert _heads(_emit(tmp_path / "other", 25, 10, monkeypatch, heads=False)) == []


def test_a_chain_reopened_signs_again_only_after_new_events_with_a_new_vouched_key(tmp_path, monkeypatch):
    spool = tmp_path / "spool"
    events = _emit(spool, 5, 100, monkeypatch)
    Emitter(RUN, PRODUCER, 0, None, spool).close()  # reopened, nothing new: no second head over the same events
    assert _heads(_spooled(spool)) == _heads(events)
    em = Emitter(RUN, PRODUCER, 0, None, spool)
    em.emit_dict("metrics", {"metrics": {"x": 1.0}})
    em.close()
    events = _spooled(spool)
    heads = _heads(events)
    assert len(heads) == 2 and heads[0].payload["attempt_key"] != heads[1].payload["attempt_key"]
    assert check_chain(RUN, PRODUCER, 0, heads, events[-1]["seq"], None).problems == []


def test_a_resumed_producer_goes_on_from_its_steps_not_its_seqs(tmp_path, monkeypatch):
    """`runledger.tools.produce` run again on a spool (the chaos suite's worker-sigkill) emits step i for its
    i-th event: the heads among them take seqs, so it goes on from the steps spooled (once it skipped one a head)."""
    from runledger.tools.produce import step_payload, steps_spooled

    spool = tmp_path / "spool"
    em = Emitter(RUN, PRODUCER, 0, None, spool)
    assert steps_spooled(em) == 0
    for i in range(25):
        em.emit_dict("step", step_payload(i), step=i)
        if i % 10 == 9:
            em.sign_head()  # (the publisher's round, offline here)
    em.close()  # (and one at close: 25 steps, 3 heads)
    assert len(_heads(_spooled(spool))) == 3
    resumed = Emitter(RUN, PRODUCER, 0, None, spool)
    assert resumed.next_seq == 28 and steps_spooled(resumed) == 25
    resumed.close()


def test_a_resumed_producer_goes_on_from_its_steps_when_its_acked_segments_are_gone(tmp_path, monkeypatch):
    """The spool lets go of a segment once the next one starts at or below what JetStream acknowledged: the heads
    in it are gone from the spool, and the producer still goes on from its last step (counting the heads left in
    the spool, it once skipped a step in the chaos suite's worker-sigkill)."""
    from runledger.ledger.emit import spool as spool_module
    from runledger.tools.produce import step_payload, steps_spooled

    monkeypatch.setattr(spool_module, "SEGMENT_EVENTS", 8)
    spool = tmp_path / "spool"
    em = Emitter(RUN, PRODUCER, 0, None, spool)
    for i in range(25):
        em.emit_dict("step", step_payload(i), step=i)
        if i % 10 == 9:
            em.sign_head()
    em.close()
    (spool / RUN / PRODUCER / "0" / "acked").write_text("28")  # (every seq acknowledged, as a publisher records it)
    resumed = Emitter(RUN, PRODUCER, 0, None, spool)
    resumed.spool.write_acked()
    assert len(resumed.spool.segments()) == 1  # (the heads' segments let go)
    assert steps_spooled(resumed) == 25
    resumed.close()


def test_a_head_reads_as_no_checkpoint(tmp_path):
    signer = HeadSigner(RUN, PRODUCER, 0, user=note.Signer.generate("user"))
    head = signer.payload(0, "ab" * 32, first=True)
    assert head["note"].startswith("runledger/chain-head/v1\n")
    with pytest.raises(note.NoteError):
        checkpoint.open_signed(head["note"], [signer.key.verifier])


def _signed_chain(n: int = 6, user: note.Signer | None = None) -> tuple[list[dict], HeadSigner]:
    """A chain of n metrics with a head after seq 2 and after the last one."""
    signer = HeadSigner(RUN, PRODUCER, 0, user=user or note.Signer.generate("user"))
    out, prev = [], ""
    for i in range(n):
        env, _ = seal(RUN, PRODUCER, 0, len(out), "metrics", {"metrics": {"x": float(i)}}, i, prev)
        out.append(env)
        prev = env["hash"]
        if i in (2, n - 1):
            env, _ = seal(RUN, PRODUCER, 0, len(out), chainheads.KIND, signer.payload(len(out) - 1, prev, i == 2), None, prev)
            out.append(env)
            prev = env["hash"]
    return out, signer


def _problems(events: list[dict], finished: int | None = None, trusted: set[str] | None = None) -> list[str]:
    return check_chain(RUN, PRODUCER, 0, _heads(events), events[-1]["seq"], finished, trusted).problems


def test_an_event_changed_inside_a_signed_range_is_named():
    events, _ = _signed_chain()
    assert _problems(events) == []
    forged = [dict(e) for e in events]
    forged[7] = {**forged[7], "prev_hash": "0" * 64}  # the chain re-sealed around seq 5 (its hashes all consistent)
    problems = _problems(forged)
    assert len(problems) == 1 and problems[0].startswith(f"{RUN}:{PRODUCER}:0:6: not the event the chain head")
    assert "seqs 4..6" in problems[0]


def test_a_head_signed_by_a_key_the_user_did_not_vouch_for_is_named():
    events, signer = _signed_chain()
    stranger = HeadSigner(RUN, PRODUCER, 0, user=signer.user)  # another attempt key, never vouched for in this chain
    last = events[-1]
    events[-1] = {**last, "payload": stranger.payload(last["seq"] - 1, last["prev_hash"], first=False)}
    assert _problems(events) == [f"{RUN}:{PRODUCER}:0:{last['seq']}: a chain head not signed by the chain's vouched "
                                 f"attempt key {RUN}/{PRODUCER}/0 (no signature by a known key ({signer.key.verifier.text()}))"]
    # a key with a vouch copied from the chain's first head: the vouch is over the other key
    forged = {**stranger.payload(last["seq"] - 1, last["prev_hash"], first=True), "vouch": signer.vouch}
    events[-1] = {**last, "payload": forged}
    assert "did not vouch for" in _problems(events)[0]
    # a key vouched for by another user's key
    other = HeadSigner(RUN, PRODUCER, 0, user=note.Signer.generate("mallory"))
    events[-1] = {**last, "payload": other.payload(last["seq"] - 1, last["prev_hash"], first=True)}
    assert "not by the chain's" in _problems(events)[0]


def test_a_finished_chain_with_events_after_its_last_head_is_named():
    events, _ = _signed_chain()
    finished, _ = seal(RUN, PRODUCER, 0, len(events), "run_finished", {"status": "completed"}, None, events[-1]["hash"])
    problems = _problems([*events, finished], finished=finished["seq"])
    assert problems == [f"{RUN}:{PRODUCER}:0:{finished['seq']}: after the last signed chain head of a finished chain "
                        f"(run_finished at seq {finished['seq']}): seqs {finished['seq']}..{finished['seq']} are not covered"]
    assert _problems([*events, finished]) == []  # a chain still running: its tail is signed later


def test_trusted_user_keys_refuse_any_other():
    user = note.Signer.generate("alice")
    events, _ = _signed_chain(user=user)
    assert _problems(events, trusted={user.verifier.text()}) == []
    problems = _problems(events, trusted={note.Signer.generate("bob").verifier.text()})
    assert problems and "not among the trusted producer keys" in problems[0]


def test_a_first_head_without_its_key_is_named():
    events, _ = _signed_chain()
    first = next(e for e in events if e["kind"] == chainheads.KIND)
    first["payload"] = {k: v for k, v in first["payload"].items() if k not in ("attempt_key", "user_key", "vouch")}
    problems = _problems(events)
    assert problems[0].startswith(f"{RUN}:{PRODUCER}:0:{first['seq']}: a chain head signed by a key no user key vouched for")


def test_a_head_comes_after_t_seconds_with_events_and_not_without(tmp_path, monkeypatch):
    monkeypatch.setenv(chainheads.INTERVAL_ENV, "0.001")
    em = Emitter(RUN, PRODUCER, 0, None, tmp_path / "spool")
    em._head_due()  # the publisher's round: nothing logged yet, no head (the attempt's key is made)
    assert em._head_signer is not None and em.next_seq == 0
    em.emit_dict("metrics", {"metrics": {"x": 1.0}})
    em._head_time -= 1.0  # (its interval passed)
    em._head_due()
    assert em.next_seq == 2
    em._head_time -= 1.0
    em._head_due()  # no event since the last head: none
    em.close()
    assert [e["kind"] for e in _spooled(tmp_path / "spool")] == ["metrics", chainheads.KIND]
