"""Attacks on signed chain heads (issue 48, item 3), each named by `runledger verify` and by `runledger tlog
audit`, which verifies the tables it is given with the same check. The promise: an event in a signed
head's range is the event the producer signed, and a head counts only if signed by an attempt key that the
chain's user key vouched for. The attacker holds a worker's NATS credentials (it can publish any event
under the worker's name, in any order) but not the producer's keys; the ledger stores what it published
as it would have arrived."""

from __future__ import annotations

from pathlib import Path

from runledger.ledger.contract.events import subject_for
from runledger.ledger.emit.sealing import seal
from runledger.ledger.ingest import service
from runledger.ledger.tlog import chainheads, note
from runledger.ledger.tlog import log as tlog
from runledger.ledger.tlog.chainheads import HeadSigner
from runledger.tools.cli import main
from support.batches import batch_for
from support.tlogs import tlog_audit, verify_root

RUN, PRODUCER = "run-1", "worker-0"
STEP = {"grad_norm": 1.0, "lr": 1e-3, "tokens": 8, "step_time_s": 0.1}


def _worker_chain(signer: HeadSigner | None, n: int = 20, every: int = 5, changed: int | None = None,
           heads_from: list[dict] | None = None) -> list[dict]:
    """A worker's chain: n steps, a head after every `every` (signed by `signer`, or copied from `heads_from`,
    as a forger who cannot sign copies the genuine ones), run_finished, a last head. `changed`: that
    step's loss is not the producer's."""
    out, prev, copied = [], "", iter(e["payload"] for e in heads_from or [] if e["kind"] == chainheads.KIND)

    def add(kind: str, payload: dict, step: int | None = None) -> None:
        nonlocal prev
        env, _ = seal(RUN, PRODUCER, 0, len(out), kind, payload, step, prev, f"2026-12-07T10:00:{len(out):02d}.000000Z")
        out.append(env)
        prev = env["hash"]

    def head() -> None:
        add(chainheads.KIND, next(copied) if signer is None else signer.payload(len(out) - 1, prev, not any(
            e["kind"] == chainheads.KIND for e in out)))

    for s in range(n):
        add("step", {"loss": 9.0 if s == changed else 1.0 / (s + 1), **STEP}, s)
        if (s + 1) % every == 0:
            head()
    add("run_finished", {"status": "completed"})
    head()
    return out


def _store_events(root: Path, events: list[dict]) -> None:
    from runledger.ledger.contract.canonical import canonical_json

    msgs = [(subject_for(e["run_id"], e["kind"]), canonical_json(e).encode(), i + 1) for i, e in enumerate(events)]
    ledger = service.Ledger(root)
    ledger.write(ledger.decode(msgs))
    ledger.commit()
    ledger.tlog.sign()



def _signer() -> HeadSigner:
    return HeadSigner(RUN, PRODUCER, 0)  # the user's key: made on first use in this test's config folder


def test_a_signed_chain_passes_verify_and_the_audit_naming_its_user_key(root, capsys):
    signer = _signer()
    _store_events(root, _worker_chain(signer))
    rc, out = verify_root(root, capsys, "--require-signed")
    assert rc == 0, out
    assert f"chain heads: 1 chains signed by user keys {signer.user.verifier.text()} (1 chains), 0 unsigned" in out
    rc, out = tlog_audit(root, capsys, "--require-signed")
    assert rc == 0 and "chain heads: 1 chains signed" in out, out


def test_an_event_written_in_the_workers_name_inside_a_signed_range_is_named(root, capsys):
    genuine = _worker_chain(_signer())
    # the attacker publishes the chain first, step 7 changed and every hash after it sealed again, the
    # producer's signed heads copied (it cannot sign new ones): the ledger keeps the first it got
    forged = _worker_chain(None, changed=7, heads_from=genuine)
    assert forged[8]["hash"] != genuine[8]["hash"] and forged[9]["payload"] == genuine[9]["payload"]
    _store_events(root, forged)
    rc, out = verify_root(root, capsys)
    assert rc == 1
    assert f"{RUN}:{PRODUCER}:0:10: not the event the chain head {RUN}:{PRODUCER}:0:11 signed" in out
    assert "an event in seqs 6..10 was written after it was signed" in out
    rc, out = tlog_audit(root, capsys)
    assert rc == 1 and f"{RUN}:{PRODUCER}:0:10: not the event the chain head {RUN}:{PRODUCER}:0:11 signed" in out


def test_a_head_signed_by_a_key_the_user_key_did_not_vouch_for_is_named(root, capsys):
    genuine = _worker_chain(_signer())
    # the attacker appends to the chain in the worker's name: a step and a head signed by a key of its own,
    # vouched for by a user key of its own
    mallory = HeadSigner(RUN, PRODUCER, 0, user=note.Signer.generate("mallory"))
    tail, prev = [], genuine[-1]["hash"]
    env, _ = seal(RUN, PRODUCER, 0, len(genuine), "step", {"loss": 0.01, **STEP}, 99, prev)
    tail.append(env)
    env, _ = seal(RUN, PRODUCER, 0, len(genuine) + 1, chainheads.KIND, mallory.payload(env["seq"], env["hash"], True),
                  None, env["hash"])
    tail.append(env)
    _store_events(root, [*genuine, *tail])
    eid = f"{RUN}:{PRODUCER}:0:{len(genuine) + 1}"
    rc, out = verify_root(root, capsys)
    assert rc == 1
    assert f"{eid}: a chain head vouched for by the user key {mallory.user.verifier.text()}, not by the chain's" in out
    assert f"{RUN}:{PRODUCER}:0:{len(genuine)}: after the last signed chain head of a finished chain" in out
    rc, out = tlog_audit(root, capsys)
    assert rc == 1 and eid in out


def test_a_chain_signed_by_a_user_key_not_trusted_fails_only_with_producer_keys(root, tmp_path, capsys):
    mallory = HeadSigner(RUN, PRODUCER, 0, user=note.Signer.generate("mallory"))  # a whole chain forged and signed
    _store_events(root, _worker_chain(mallory))
    rc, out = verify_root(root, capsys)
    assert rc == 0 and mallory.user.verifier.text() in out  # without a list of keys: the key is named
    trusted = tmp_path / "producer-keys"
    trusted.write_text(f"# the team's keys\n{_signer().user.verifier.text()}\n")
    rc, out = verify_root(root, capsys, "--producer-keys", str(trusted))
    assert rc == 1 and "not among the trusted producer keys" in out
    rc, out = tlog_audit(root, capsys, "--producer-keys", str(trusted))
    assert rc == 1 and "not among the trusted producer keys" in out


def test_chains_without_heads_are_unsigned_and_fail_only_when_signatures_are_required(root, capsys):
    _store_events(root, [])
    ledger = service.Ledger(root)
    ledger.write(ledger.decode(batch_for(["old-run"], 10)))  # written before heads (or imported, or published)
    ledger.commit()
    ledger.tlog.sign()
    rc, out = verify_root(root, capsys)
    assert rc == 0 and "chain heads: 0 chains signed, 1 unsigned" in out, out
    rc, out = verify_root(root, capsys, "--require-signed")
    assert rc == 1 and "chain old-run:worker-0:0: no signed chain head" in out
    assert tlog_audit(root, capsys)[0] == 0
    rc, out = tlog_audit(root, capsys, "--require-signed")
    assert rc == 1 and "chain old-run:worker-0:0: no signed chain head" in out


def test_an_export_is_checked_as_its_root_is(root, tmp_path, capsys):
    genuine = _worker_chain(_signer())
    _store_events(root, _worker_chain(None, changed=7, heads_from=genuine))
    out_dir = tmp_path / "export"
    assert main(["export", "--all", "--root", str(root), "--out", str(out_dir)]) == 0
    rc, out = verify_root(out_dir, capsys)
    assert rc == 1 and f"{RUN}:{PRODUCER}:0:10: not the event the chain head {RUN}:{PRODUCER}:0:11 signed" in out
    capsys.readouterr()  # the audit of the export: the same check
    vkey = note.read_key(tlog.key_file()).verifier.text()
    rc = main(["tlog", "audit", "--log", str(root / "tlog"), "--vkey", vkey, "--events", str(out_dir)])
    assert rc == 1 and "not the event the chain head" in capsys.readouterr().out
