"""Signed chain heads in a real run (issue 48, item 3): `runledger.init` / `log` / `finish` on the embedded
local root sign the run's chain every N events and at finish; `verify --require-signed` passes on it, and
the same root holding an imported run (which has no heads) fails it, naming that run's chain. What a dead
worker left in its spool is sent by another process (`send_leftovers`), which signs nothing in its name."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time

import numpy as np

import runledger
from runledger.ledger.emit.emitter import send_leftovers
from runledger.ledger.tlog import chainheads
from support import REPO
from support.importers import write_tensorboard
from support.processes import cli, wait_serving
from support.reading import reader, wait_for_count

WATCHDOG_S = 120  # the publisher's first round has come by then (not a timing assert)


def test_a_logged_run_is_signed_and_an_imported_one_fails_only_require_signed(local_root, tmp_path, monkeypatch):
    monkeypatch.setenv(chainheads.HEADS_ENV, "on")  # (the default: runledger.ledger.tlog.chainheads.enabled)
    monkeypatch.setenv(chainheads.EVERY_ENV, "40")
    run = runledger.init(id="signed", system_metrics=False)
    for i in range(100):
        runledger.log({"loss": 1.0 / (i + 1)}, step=i)
    watchdog = time.monotonic() + WATCHDOG_S
    while run._sink._head_next == 0 and time.monotonic() < watchdog:  # the publisher's round signs, off `log`'s thread
        time.sleep(0.01)
    for i in range(100, 110):
        runledger.log({"loss": 1.0 / (i + 1)}, step=i)
    assert run.finish()

    heads = reader(local_root).execute(
        "select seq, upto_seq, head, prev_hash, payload from chain_heads where run_id = 'signed' order by seq").fetchall()
    last = reader(local_root).execute("select max(seq) from events where run_id = 'signed'").fetchall()[0][0]
    assert len(heads) >= 2 and heads[-1][0] == last  # every 40 events (at the publisher's rounds) and at finish
    assert all(upto == seq - 1 and head == prev for seq, upto, head, prev, _ in heads)
    assert "attempt_key" in json.loads(heads[0][4])
    assert stat.S_IMODE(chainheads.user_key_file().stat().st_mode) == 0o600

    done = cli("verify", "--root", str(local_root), "--require-signed")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "chain heads: 1 chains signed by user keys" in done.stdout and ", 0 unsigned" in done.stdout

    logdir = tmp_path / "tb" / "mlp-1"
    write_tensorboard(logdir, range(0, 10), np.random.default_rng(3))
    done = cli("import", "tensorboard", str(logdir), "--root", str(local_root))
    assert done.returncode == 0, done.stderr
    imported = done.stdout.strip().split(":")[0]
    done = cli("verify", "--root", str(local_root))
    assert done.returncode == 0 and ", 1 unsigned" in done.stdout, done.stdout + done.stderr
    done = cli("verify", "--root", str(local_root), "--require-signed")
    assert done.returncode == 1
    problems = [line for line in done.stdout.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and f"chain {imported}:" in problems[0] and "no signed chain head" in problems[0]


# a worker that spools `n` events offline, signs a head after the first `signed` of them (as its publisher's
# round would; 0: none), and dies without closing (no head at close): its events stay in the spool
DEAD_WORKER = """import os, sys
from runledger.ledger.emit.emitter import Emitter
run, producer, spool, n, signed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
em = Emitter(run, producer, 0, None, spool)
for i in range(n):
    em.emit_dict("metrics", {"metrics": {"x": float(i)}}, i)
    if i + 1 == signed:
        em.sign_head()
os._exit(0)
"""


def test_leftovers_sent_for_a_dead_worker_carry_only_the_heads_it_signed(tmp_path, monkeypatch, ledger_process):
    """The root's supervisor (or `runledger sync`) sends what dead workers left with heads on in its own
    environment; it holds none of their attempt keys, so it must add no head: the chains are stored as the
    workers sealed them, one head in worker-0's (over its first 10 events) and none in worker-1's."""
    monkeypatch.setenv(chainheads.HEADS_ENV, "on")
    spool = tmp_path / "spool"
    for producer, signed in (("worker-0", 10), ("worker-1", 0)):
        subprocess.run([sys.executable, "-c", DEAD_WORKER, "dead", producer, str(spool), "25", str(signed)], cwd=REPO,
                       check=True, timeout=120)
    ledger_process.start()
    wait_serving(ledger_process)
    assert send_leftovers(spool, ledger_process.nats_url) == 26 + 25
    root = ledger_process.root
    assert wait_for_count(root, "select count(*) from events where run_id = 'dead'", 51, timeout=60) == 51
    con = reader(root)
    assert con.execute("select producer, seq, upto_seq from chain_heads where run_id = 'dead'").fetchall() == [
        ("worker-0", 10, 9)]
    assert con.execute("select producer, max(seq) from events where run_id = 'dead' group by producer "
                       "order by producer").fetchall() == [("worker-0", 25), ("worker-1", 24)]
    done = cli("verify", "--root", str(root))
    assert done.returncode == 0 and "1 chains signed" in done.stdout and ", 1 unsigned" in done.stdout, done.stdout
