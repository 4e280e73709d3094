"""The worker attests the checkpoints it saves: a `tiny` run through a real nats-server and the real ledger
stores one `attestation` event per checkpoint; each folder verifies (`runledger attest verify`), its statement
names the config, the data and the code, and as byproduct a checkpoint of the root's log signed by the log's
key; a byte flipped in a file of the orbax folder fails model signing's verifier and the audit. Without the
`[attest]` extra the worker still trains and saves, says once why nothing is attested, and emits none."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.util
import json
import logging
import time
from pathlib import Path

import pytest

from runledger.ledger import attest
from runledger.ledger.emit.sink import ListSink
from runledger.ledger.tlog import checkpoint, log, note
from runledger.tools.cli import main as runledger_main
from runledger.training.config import PRESETS, config_hash
from support.attesting import flip_a_byte, read_as_in_toto
from support.reading import reader, wait_for_count

pytest.importorskip("model_signing", reason="the [attest] extra")


def test_a_tiny_runs_checkpoints_are_attested_and_an_edited_one_is_refused(root, nats_server, ledger_process, capsys):
    ledger_process.start()
    # a log checkpoint signed before the run, so that every statement has one to name (on a loaded machine the
    # tiny run's last checkpoint could otherwise be attested before the ledger signed its first: "none available")
    from runledger.ledger.emit.emitter import Emitter

    warm = Emitter("warm-up", "worker-0", 0, nats_server.url, root.parent / "warm-up-spool")
    warm.emit_dict("metrics", {"metrics": {"loss": 1.0}}, 0)
    assert warm.close(60)
    deadline = time.monotonic() + 120
    while not (root / "tlog" / "checkpoint").exists():
        assert time.monotonic() < deadline, "the ledger signed no log checkpoint"
        time.sleep(0.1)
    assert runledger_main(["train", "--preset", "tiny", "--run-id", "attested", "--nats", nats_server.url,
                           "--root", str(root), "--steps", "4"]) == 0
    assert wait_for_count(root, "select count(*) from attestations where run_id = 'attested'", 1) >= 1
    rows = reader(root).execute("select a.path, a.statement_sha256, a.content_hash, c.content_hash, a.tlog_size "
                                "from attestations a join checkpoints c using (run_id, path) "
                                "where run_id = 'attested' order by a.step").fetchall()
    assert rows and all(r[2] == r[3] for r in rows)  # each attests the checkpoint its `checkpoint` event names
    folder = Path(rows[-1][0])
    assert runledger_main(["attest", "verify", str(folder), "--root", str(root)]) == 0
    assert "its log checkpoint is the root's log's (tlog/checkpoint size" in capsys.readouterr().out
    assert runledger_main(["attest", "verify", "--run", "attested", "--root", str(root)]) == 0  # each checkpoint
    assert capsys.readouterr().out.count("ok: ") == len(rows)
    assert runledger_main(["verify", "--root", str(root)]) == 0  # verify runs the same check on every attestation
    assert f"attestations: {len(rows)} checked" in capsys.readouterr().out

    st = json.loads((folder / attest.STATEMENT).read_bytes())
    build = st["predicate"]["buildDefinition"]
    started = reader(root).execute("select config_hash, config from runs where run_id = 'attested'").fetchone()
    assert build["externalParameters"]["config_hash"] == started[0] == config_hash(PRESETS["tiny"])
    assert build["externalParameters"]["config"] == json.loads(started[1])
    assert any(d["name"].startswith("data/") for d in build["resolvedDependencies"])
    if importlib.util.find_spec("in_toto_attestation"):
        assert len(read_as_in_toto(st).run_details.byproducts) == 1
    (tlog_cp,) = st["predicate"]["runDetails"]["byproducts"]
    signed = base64.b64decode(tlog_cp["content"]).decode()
    cp = checkpoint.open_signed(signed, [note.read_key(log.key_file()).verifier])  # the log's key signed it
    assert cp.size == tlog_cp["annotations"]["size"] == rows[-1][4]
    # a log checkpoint that is not the root's log's (another tree at that size) is refused
    forged = signed.split("\n")
    forged[2] = base64.b64encode(bytes(32)).decode()
    forged = "\n".join(forged).encode()
    tlog_cp.update(content=base64.b64encode(forged).decode(), digest={"sha256": hashlib.sha256(forged).hexdigest()})
    with pytest.raises(attest.AttestFailed, match="is not a checkpoint of"):
        attest.check_log_checkpoints(st, root)

    flip_a_byte(next(p for p in (folder / "state").rglob("*") if p.is_file() and p.stat().st_size > 64))
    from model_signing import verifying

    with pytest.raises(ValueError, match="Hash mismatch"):
        verifying.Config().use_elliptic_key_verifier(public_key=attest.public_file(attest.key_file())).verify(
            folder, folder / attest.SIGNATURE)
    assert runledger_main(["attest", "verify", str(folder), "--root", str(root)]) == 1
    assert capsys.readouterr().err.startswith("FAILED: model signing refuses")
    assert runledger_main(["attest", "verify", "--run", "attested", "--root", str(root)]) == 1
    assert f"FAILED: model signing refuses {folder}" in capsys.readouterr().err
    assert runledger_main(["verify", "--root", str(root)]) == 1
    problems = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  - ")]
    assert len(problems) == 1 and problems[0].startswith("  - attestation attested:worker-0:0:") \
        and "model signing refuses" in problems[0], problems  # one line, naming the event
    assert ledger_process.terminate() == 0


def test_without_the_extra_the_worker_trains_saves_and_says_why(tmp_path, monkeypatch, caplog):
    from runledger.training.worker import train

    monkeypatch.setattr(attest, "unavailable", lambda: "model_signing is not installed (pip install 'runledger[attest]')")
    rec = ListSink()
    with caplog.at_level(logging.INFO, logger="runledger.training.worker"):
        res = train(dataclasses.replace(PRESETS["tiny"], steps=2, ckpt_every=2), run_id="plain", ckpt_dir=tmp_path,
                    sink=rec, peak_flops=1e11)
    assert [s for s, _ in rec.payloads("checkpoint")] == [2] and res.checkpoints
    assert rec.payloads("attestation") == []
    said = [r.getMessage() for r in caplog.records if "not attested" in r.getMessage()]
    assert said == ["plain: checkpoints are not attested: model_signing is not installed (pip install 'runledger[attest]')"]
    assert not (Path(res.checkpoints[0]["path"]) / attest.SIGNATURE).exists()


def test_a_list_sink_run_gets_one_attestation_per_checkpoint_before_run_finished(tmp_path):
    from runledger.training.worker import train

    rec = ListSink("worker-0")
    train(dataclasses.replace(PRESETS["tiny"], steps=4, ckpt_every=2), run_id="listed", ckpt_dir=tmp_path, sink=rec,
          peak_flops=1e11)
    kinds = [k for k, _, _ in rec.events]
    assert kinds[-1] == "run_finished" and kinds.count("attestation") == kinds.count("checkpoint") == 2
    for (step, saved), (step2, attested) in zip(rec.payloads("checkpoint"), rec.payloads("attestation")):
        assert step == step2 and attested["path"] == saved["path"] and attested["content_hash"] == saved["content_hash"]
        assert attest.verify(saved["path"], public=attest.public_pem(attest.key_file()), root=None).startswith("ok: ")
