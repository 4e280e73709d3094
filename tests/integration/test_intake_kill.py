"""SIGKILL at random points between `log` accepting values and the publisher's thread sealing them: every
value `log` returned for is stored exactly once, and `verify` finds the chain whole."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap

from support import REPO
from support.reading import reader

CHILD = textwrap.dedent("""
    import sys, runledger
    run = runledger.init(id=sys.argv[1], system_metrics=False)
    print("started", flush=True)
    for i in range(10**7):
        runledger.log({"loss": i / 7, "step_seen": float(i), "note": f"n{i}"}, step=i)
        print(i, flush=True)  # after log returned: the values are accepted
""")


def test_sigkill_at_random_points_between_accept_and_seal_loses_and_doubles_nothing(local_root):
    rng = random.Random(39)
    runs = {}
    for k in range(3):
        run_id = f"killed-{k}"
        child = subprocess.Popen([sys.executable, "-c", CHILD, run_id], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "started"
        stop_after, last = rng.randint(1, 3000), -1
        while last < stop_after:
            last = int(child.stdout.readline())
        child.kill()  # mid-loop: some values sealed and published, some only accepted, one maybe half-copied
        child.wait()
        runs[run_id] = last
        # read at once: the root's supervisor seals and sends what it left (holding its chain meanwhile), and the
        # reader waits for it as `runledger sql` does (runledger.ledger.storing), not taking it for a live run
        stored = reader(local_root).execute("select count(*) from metrics where run_id = ? and key = 'step_seen'",
                                            [run_id]).fetchall()
        assert stored[0][0] >= last + 1, f"{run_id}: {stored[0][0]} read at once, {last + 1} accepted"
    db = reader(local_root)
    for run_id, last in runs.items():
        rows = db.execute("select step, count(*), min(value), max(value) from metrics where run_id = ? "
                          "and key = 'step_seen' group by step order by step", [run_id]).fetchall()
        assert len(rows) >= last + 1, f"{run_id}: {len(rows)} steps stored, {last + 1} accepted"
        assert all(n == 1 for _, n, _, _ in rows), f"{run_id}: a step stored twice"
        assert [s for s, *_ in rows] == list(range(len(rows)))
        assert all(lo == hi == float(s) for s, _, lo, hi in rows)
        events = db.execute("select count(*), count(distinct seq) from events where run_id = ? and kind = 'metrics' "
                            "and payload like '%\"note\":\"n%'", [run_id]).fetchall()
        assert events == [(len(rows), len(rows))]
    done = subprocess.run([sys.executable, "-m", "runledger.tools.cli", "verify", "--root", str(local_root)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
