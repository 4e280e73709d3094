"""The spool's intake (`Spool.accept`): what `log` hands over is sealed later, off the caller's thread, to
the very bytes sealing inline gives, and a crash between accept and seal loses and doubles nothing."""

from __future__ import annotations

import json
import random
import shutil

from runledger.ledger.contract.canonical import canonical_json, event_hash
from runledger.ledger.emit import spool as spool_mod
from runledger.ledger.emit.sealing import seal, utc_now
from runledger.ledger.emit.spool import Spool, chain_dir

RUN, PRODUCER, ATTEMPT = "run-1", "main", 0


def payloads(n: int, seed: int = 0) -> list[dict]:
    """`log`'s payloads of every shape: floats, a null for a value not finite, text, many names."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = {"metrics": {f"m{j}": rng.uniform(-1e6, 1e6) for j in range(rng.randint(1, 30))}}
        if i % 7 == 3:
            p["metrics"]["loss"] = None
            p["nonfinite"] = {"loss": "nan"}
        if i % 11 == 5:
            p["text"] = {"note": "ünïcode \"quoted\" \\ text", "empty": None}
        out.append(p)
    return out


def inline_texts(records: list[tuple]) -> list[bytes]:
    """What sealing each record inline, at its time, gives."""
    prev, texts = "", []
    for seq, kind, step, at, payload in records:
        env, text = seal(RUN, PRODUCER, ATTEMPT, seq, kind, payload, step, prev, at)
        prev = env["hash"]
        texts.append(text.encode())
    return texts


def segment_lines(d) -> list[bytes]:
    return [line for seg in sorted(d.glob("seg-*.jsonl")) for line in seg.read_bytes().splitlines()]


def accept_all(spool: Spool, items: list[dict]) -> list[tuple]:
    records = []
    for i, p in enumerate(items):
        at = utc_now()
        with spool.lock:
            seq = spool.accept("metrics", p, i * 3 if i % 5 else None, at)
        records.append((seq, "metrics", i * 3 if i % 5 else None, at, p))
    return records


def test_sealed_later_is_byte_for_byte_what_sealing_inline_gives(tmp_path):
    spool = Spool(chain_dir(tmp_path, RUN, PRODUCER, ATTEMPT), 1 << 30)
    records = accept_all(spool, payloads(300))
    assert spool.next_seq == 300 and spool.seq == 0  # accepted, none sealed yet
    assert spool.seal_accepted() == 300
    lines = segment_lines(spool.dir)
    assert lines == inline_texts(records)
    prev = ""
    for line in lines:  # and an outside checker's recomputation agrees: each hash over its canonical envelope
        env = json.loads(line)
        assert env["prev_hash"] == prev
        assert event_hash(env, canonical_json(env["payload"])) == env["hash"]
        prev = env["hash"]
    spool.close()
    assert not list(spool.dir.glob("in-*")), "a clean close leaves no intake file"


def test_a_crash_between_accept_and_seal_is_sealed_on_reopening_once_and_the_same(tmp_path):
    spool = Spool(chain_dir(tmp_path / "a", RUN, PRODUCER, ATTEMPT), 1 << 30)
    items = payloads(120, seed=3)
    records = accept_all(spool, items[:40])
    spool.seal_accepted()  # the first 40 sealed before the "crash"...
    records += accept_all(spool, items[40:])  # ...the other 80 only accepted
    records = [(s, *r[1:]) for s, r in zip(range(120), records)]
    # the crash: the chain's files as a SIGKILL leaves them (the mapped intake's bytes are the file's)
    crashed = chain_dir(tmp_path / "b", RUN, PRODUCER, ATTEMPT)
    shutil.copytree(spool.dir, crashed, ignore=shutil.ignore_patterns("lock"))
    assert len(segment_lines(crashed)) == 40
    reopened = Spool(crashed, 1 << 30)
    assert reopened.seq == reopened.next_seq == 120 and len(reopened.pending) == 120
    assert segment_lines(crashed) == inline_texts(records)
    assert not list(crashed.glob("in-*")) and not (crashed / "damaged").exists()
    reopened.close()
    again = Spool(crashed, 1 << 30)  # opened once more: nothing sealed twice
    assert again.seq == 120 and segment_lines(crashed) == inline_texts(records)
    again.close()
    spool.close()


def test_a_torn_intake_record_is_set_aside_with_its_reason_and_the_rest_kept(tmp_path):
    spool = Spool(chain_dir(tmp_path / "a", RUN, PRODUCER, ATTEMPT), 1 << 30)
    records = accept_all(spool, payloads(10))
    crashed = chain_dir(tmp_path / "b", RUN, PRODUCER, ATTEMPT)
    shutil.copytree(spool.dir, crashed, ignore=shutil.ignore_patterns("lock"))
    [intake] = crashed.glob("in-*.jsonl")
    data = bytearray(intake.read_bytes())
    end = data.index(0)
    data[end:end + 12] = b'[10,"metrics'  # a copy cut off by the kill
    intake.write_bytes(bytes(data))
    reopened = Spool(crashed, 1 << 30)
    assert reopened.seq == 10 and segment_lines(crashed) == inline_texts(records)
    [reason] = (crashed / "damaged").glob("*.reason")
    assert "torn" in reason.read_text()
    reopened.close()
    spool.close()


def test_intake_files_roll_over_and_go_once_what_they_hold_is_synced(tmp_path, monkeypatch):
    monkeypatch.setattr(spool_mod, "INTAKE_BYTES", 4096)
    spool = Spool(chain_dir(tmp_path, RUN, PRODUCER, ATTEMPT), 1 << 30)
    records = accept_all(spool, payloads(60, seed=5))
    assert len(list(spool.dir.glob("in-*.jsonl"))) > 3  # rolled over
    spool.seal_accepted()
    spool.sync()
    assert [p.name for p in spool.dir.glob("in-*.jsonl")] == [spool._in_files[-1][0].name]  # the one being written
    assert segment_lines(spool.dir) == inline_texts(records)
    spool.close()


def test_an_event_emitted_inline_comes_after_every_event_accepted_before_it(tmp_path):
    from runledger.ledger.emit.emitter import Emitter

    em = Emitter(RUN, PRODUCER, ATTEMPT, "nats://127.0.0.1:1", tmp_path)  # a publisher that never connects
    try:
        for i in range(50):
            em.accept("metrics", {"metrics": {"loss": float(i)}}, i)
            if i % 10 == 9:
                em.emit_dict("alert", {"alert_id": f"a{i}", "agent": "me", "rule": "r", "severity": "info",
                                       "message": ""}, i)
        assert em.next_seq == 55
    finally:
        em.close(0.01, say_unsent=False)
    envs = [json.loads(line) for line in segment_lines(em.dir)]
    assert [e["seq"] for e in envs if e["kind"] != "chain_head"] == list(range(55))  # (and the head signed at close)
    assert [e["kind"] for e in envs[:11]] == ["metrics"] * 10 + ["alert"]
    assert all(b["prev_hash"] == a["hash"] for a, b in zip(envs, envs[1:]))
