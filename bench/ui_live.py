"""The dashboard live, whatever started first (issue 37, item 6): the time from a step's storing (the ledger's
commit, seen as its stored position moving) to the step's point in the page's chart, in Debian's chromium
(selenium, headless), in one command:

    python -m bench.ui_live [--steps 20] [--keep DIR]

One root on the embedded default: a user's script (`runledger.init` with no server configured, then one
`run.log` at a time, told by the bench over its stdin) starts the root's server and ledger. Measured, each
over `--steps` steps logged one at a time, each after a random pause of 0.1-1.0 s (the polls' phase is
sampled, not fixed):
- follow: `runledger ui --root R` (no server named), started before the run on a root that has no server;
- named, the baseline: `runledger ui --root R --nats URL`, the root's embedded server named on the command
  line (what a dashboard did before when it was told the server);
- tables: `runledger ui --root R --nats nats://127.0.0.1:1` (nothing answers there): live by polling the
  ledger's stored position (ui/live.py POLL_S);
- follow, moved: the first dashboard again, after the script finished, the server stopped once idle
  (RUNLEDGER_IDLE_S=1) and the next script's server came up on another port.
For each: commit -> page (median, p90, max) and `run.log` returned -> page. Also how long the follow
dashboard took to go live via NATS after the script started and after its `runledger.init` returned (its
badge, read every 50 ms).

How: a thread reads the root's stored positions every 1 ms (the time of each move: the commit, as
`runledger.ledger.storage.stored` sees it); the page records, every 2 ms, the time its charts' point count
changes (`window.rlCharts`, the points handed to uPlot: before the next paint). Both are this machine's
wall clock (Python's time.time, the page's Date.now).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

from bench.ui import browser, free_port, uptime
from runledger.ledger import local
from runledger.ledger.storage import stored

REPO = Path(__file__).resolve().parent.parent
WAIT_S = 60.0  # a step not on the page this long after its log is counted lost (and said so), not waited for
STEPS = 20

SCRIPT = """
import runledger, sys
run = runledger.init(project="bench-live", name=sys.argv[1], system_metrics=False)
print(run.id, flush=True)
for line in sys.stdin:
    if line.strip() == "finish":
        break
    run.log({"loss": 1.0 / (1 + int(line))}, step=int(line))
    print(line.strip(), flush=True)
run.finish()
"""

# the page's side: the time each change of its charts' point count was seen (Date.now(), ms)
WATCH_PAGE = """
window.__seen = [];
if (!window.__watching) {
  window.__watching = true;
  const total = () => (window.rlCharts || []).reduce((n, c) => n + c.points(), 0);
  let last = total();
  setInterval(() => { const n = total(); if (n !== last) { last = n; window.__seen.push([Date.now(), n]); } }, 2);
}
"""


def env(root: Path) -> dict:
    out = {k: v for k, v in os.environ.items() if k not in ("RUNLEDGER_NATS", "RUNLEDGER_CREDS")}
    return {**out, "RUNLEDGER_ROOT": str(root), "RUNLEDGER_IDLE_S": "1", "RUNLEDGER_HEARTBEAT_S": "3600",
            "PYTHONPATH": str(REPO)}


class Script:
    """The user's script in its own process: init now, `log(step)`, `finish()`."""

    def __init__(self, root: Path, name: str):
        self.started = time.time()
        self.proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SCRIPT), name], cwd=REPO, env=env(root),
                                     text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.id = self.proc.stdout.readline().strip()
        self.inited = time.time()
        if not self.id:
            raise RuntimeError(f"the script {name} did not start")

    def log(self, step: int) -> None:
        self.proc.stdin.write(f"{step}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == str(step)

    def finish(self) -> None:
        self.proc.stdin.write("finish\n")
        self.proc.stdin.close()
        self.proc.wait(120)


class Commits:
    """The times the root's stored position moved, read every 1 ms in a thread."""

    def __init__(self, root: Path):
        self.root, self.moves, self.done = root, [], threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        last = None
        while not self.done.is_set():
            now = max(stored.positions(self.root).values(), default=0)
            if now != last:
                self.moves.append((time.time(), now))
                last = now
            time.sleep(0.001)

    def position(self) -> int:
        return self.moves[-1][1] if self.moves else 0

    def first_after(self, position: int, timeout: float = WAIT_S) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, p in list(self.moves):
                if p > position:
                    return t
            time.sleep(0.002)
        return None


class Dashboard:
    def __init__(self, root: Path, tmp: Path, *args: str):
        self.port = free_port()
        self.log = open(tmp / f"ui-{self.port}.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "ui", "--root", str(root),
                                      "--port", str(self.port), *args], cwd=REPO, env=env(root),
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        if not self.proc.stdout.readline().startswith("http://"):
            raise RuntimeError(f"runledger ui did not start; see {self.log.name}")
        self.base = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def until(what, timeout: float = WAIT_S, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while not (got := what()) and time.monotonic() < deadline:
        time.sleep(every)
    if not got:
        raise TimeoutError("waited in vain")
    return got


def via(driver) -> str:
    return driver.execute_script("return document.getElementById('live').dataset.via || ''")


def open_run(driver, base: str | None, root: Path, run_id: str, want: str) -> None:
    """The run's page (a new document at `base`, or the fragment only), once its first step is stored; drawn,
    its badge `want`."""
    from runledger import queries

    until(lambda: queries.query(root, f"select count(*) from metrics_all where run_id = '{run_id}'")[1][0][0] >= 1)
    if base:
        driver.get(f"{base}/#/run/{run_id}")
    else:
        driver.execute_script("location.hash = arguments[0]", f"#/run/{run_id}")
    until(lambda: driver.execute_script("return document.body.dataset.ready === '1' && location.hash.startsWith('#/run/') "
                                        "&& (window.rlCharts || []).some(c => c.points() > 0)"))
    until(lambda: via(driver) == want)


def measure(driver, script: Script, commits: Commits, steps: range) -> dict:
    """Log each step, one at a time; commit -> page and log -> page, in seconds."""
    to_page, from_log, lost = [], [], []
    for step in steps:
        time.sleep(random.uniform(0.1, 1.0))
        driver.execute_script(WATCH_PAGE)
        before = driver.execute_script("return (window.rlCharts || []).reduce((n, c) => n + c.points(), 0)")
        position = commits.position()
        script.log(step)
        logged = time.time()
        try:
            seen = until(lambda: next((t for t, n in driver.execute_script("return window.__seen") if n > before), None),
                         every=0.01) / 1000
        except TimeoutError:
            lost.append(step)
            continue
        commit = commits.first_after(position)
        if commit is not None:
            to_page.append(seen - commit)
            from_log.append(seen - logged)
    return {"commit_to_page": summary(to_page), "log_to_page": summary(from_log), "lost": lost}


def summary(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    xs = sorted(xs)
    return {"n": len(xs), "median_s": round(statistics.median(xs), 3), "p90_s": round(xs[int(0.9 * (len(xs) - 1))], 3),
            "max_s": round(xs[-1], 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ui_live", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--keep", type=Path, default=None, help="the root's parent folder (default: a new temporary one)")
    args = p.parse_args(argv)
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="bench-ui-live-"))
    tmp.mkdir(parents=True, exist_ok=True)
    root = tmp / "root"
    out = {"load_before": uptime(), "steps": args.steps}
    driver = browser()
    dashboards, scripts, commits = [], [], Commits(root)
    try:
        first = Dashboard(root, tmp)  # before any run: the root has no server
        dashboards.append(first)
        driver.get(f"{first.base}/#/")
        until(lambda: via(driver) == "tables")
        a = Script(root, "first")
        scripts.append(a)
        until(lambda: via(driver) == "nats", every=0.05)
        out["follow_live_s"] = {"after_start": round(time.time() - a.started, 2), "after_init": round(time.time() - a.inited, 2)}
        a.log(0)
        open_run(driver, None, root, a.id, "nats")
        n, k = args.steps, 1
        out["follow"] = measure(driver, a, commits, range(k, k + n))
        k += n
        named = Dashboard(root, tmp, "--nats", local.running_url(root))
        dashboards.append(named)
        open_run(driver, named.base, root, a.id, "nats")
        out["named"] = measure(driver, a, commits, range(k, k + n))
        k += n
        tables = Dashboard(root, tmp, "--nats", "nats://127.0.0.1:1")
        dashboards.append(tables)
        open_run(driver, tables.base, root, a.id, "tables")
        out["tables"] = measure(driver, a, commits, range(k, k + n))
        old_url = local.running_url(root)
        a.finish()
        driver.get(f"{first.base}/#/")
        until(lambda: local.running_url(root) is None, timeout=120)  # idle: stopped by itself
        until(lambda: via(driver) == "tables")
        b = Script(root, "second")
        scripts.append(b)
        until(lambda: via(driver) == "nats", every=0.05)
        out["moved_live_s"] = {"after_start": round(time.time() - b.started, 2), "after_init": round(time.time() - b.inited, 2)}
        out["servers"] = [old_url, local.running_url(root)]
        b.log(0)
        open_run(driver, None, root, b.id, "nats")
        out["follow_moved"] = measure(driver, b, commits, range(1, 1 + n))
        b.finish()
    finally:
        commits.done.set()
        for s in scripts:
            if s.proc.poll() is None:
                s.proc.kill()
        for d in dashboards:
            d.stop()
        driver.quit()
        local.down(root)
    out["load_after"] = uptime()
    print(json.dumps(out, indent=1))
    for mode in ("follow", "named", "tables", "follow_moved"):
        m = out[mode]
        c, g = m["commit_to_page"], m["log_to_page"]
        print(f"{mode:13s} commit->page median {c.get('median_s')} s, p90 {c.get('p90_s')} s, max {c.get('max_s')} s (n={c['n']}); "
              f"log->page median {g.get('median_s')} s, p90 {g.get('p90_s')} s; lost {m['lost']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
