"""Signed chain heads in a real run (issue 48, item 3): `runledger.init` / `log` / `finish` on the embedded
local root sign the run's chain every N events and at finish; `verify --require-signed` passes on it, and
the same root holding an imported run (which has no heads) fails it, naming that run's chain."""

from __future__ import annotations

import json
import stat
import time

import numpy as np

import runledger
from runledger.ledger.tlog import chainheads
from support.importers import write_tensorboard
from support.processes import cli
from support.reading import reader

WATCHDOG_S = 120  # the publisher's first round has come by then (not a timing assert)


def test_a_logged_run_is_signed_and_an_imported_one_fails_only_require_signed(local_root, tmp_path, monkeypatch):
    monkeypatch.setenv(chainheads.HEADS_ENV, "on")  # (off by default: runledger.ledger.tlog.chainheads.enabled)
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
