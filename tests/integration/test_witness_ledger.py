"""The ledger service (`runledger ledger serve`, a child process fed by a real nats-server) with a
policy naming a witness (`runledger witness serve`, another): what producers send is stored, logged,
signed and cosigned, and `runledger tlog audit --policy` passes from the public files; the ledger
stops cleanly with its witnessing thread running."""

from __future__ import annotations

import time

from runledger.ledger.tlog import chainheads, cosignature, policy, tiles
from runledger.ledger.tlog import log as tlog
from support.processes import WitnessProcess, cli, start_producer, wait_serving


def test_a_served_ledger_gets_its_checkpoints_cosigned(tmp_path, nats_server, ledger_process, root, monkeypatch):
    vkey = tlog.load_or_make_key().verifier.text()
    w = WitnessProcess(tmp_path, vkey).start()
    try:
        pol = tmp_path / "policy.txt"
        pol.write_text(f"log {vkey}\nwitness W1 {w.vkey} {w.url}\nquorum W1\n")
        monkeypatch.setenv(policy.POLICY_ENV, str(pol))  # (the ledger process inherits it)
        # the log's size: the producer's 40 steps, and with signed heads on the chain_head its close seals (the
        # one head: none at the publisher's rounds, so long apart; the producer inherits it)
        monkeypatch.setenv(chainheads.INTERVAL_ENV, "3600")
        size = 40 + chainheads.enabled()
        ledger_process.start()
        wait_serving(ledger_process)
        producer = start_producer(nats_server.url, tmp_path / "spool", "witnessed", "worker-0", 40)
        assert producer.wait(timeout=120) == 0, producer.stderr.read()
        witness_key = cosignature.CosignVerifier.parse(w.vkey)
        deadline = time.monotonic() + 120
        while True:  # stored, logged, signed (at once when idle), then cosigned in the background
            path = root / "tlog" / tiles.CHECKPOINT
            signed = path.read_text() if path.exists() else ""
            if signed and signed.split("\n")[1] == str(size) and cosignature.cosigners(signed, [witness_key]):
                break
            assert time.monotonic() < deadline, (signed, ledger_process.log_path.read_text()[-3000:])
            time.sleep(0.2)
        r = cli("tlog", "audit", "--log", str(root / "tlog"), "--policy", str(pol), "--events", str(root))
        assert r.returncode == 0 and f"size {size}" in r.stdout and "cosigned by W1" in r.stdout, r.stdout + r.stderr
        assert ledger_process.terminate() == 0
    finally:
        w.stop()
