"""The chaos run, short: every fault kind 5 times during streams; nothing lost, nothing doubled."""

from __future__ import annotations

import subprocess
import sys

from support import REPO


def test_chaos_quick_loses_and_duplicates_nothing():
    r = subprocess.run([sys.executable, "-m", "runledger.tools.chaos", "--quick"], cwd=REPO, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    table = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line and not line.startswith(" ")}
    for fault in ("ledger-sigkill", "nats-restart", "worker-sigkill"):
        row = table[fault]
        injected, emitted, stored, lost, duplicated = map(int, row[1:6])
        assert injected == 5 and emitted == stored and lost == 0 and duplicated == 0, row
    assert "verify: ok" in r.stdout
