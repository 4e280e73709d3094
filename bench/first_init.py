"""Where the first `runledger.init` on a new root, and its `finish`, spend their seconds.

    python -m bench.first_init [--repeat N] [--code DIR]

Each repeat is a fresh process on a fresh root with the embedded default (no RUNLEDGER_NATS), as a new
user's first script: it imports runledger, calls init, logs one step and finishes. Its phases are
timed by wrapping the functions init and finish call (in that process only), and the root's
supervisor (a second process init starts) is timed from its log's timestamps:

  import runledger               the package's import
  init: attach                   local.attach: the start lock, the supervisor started, until it wrote its URL
    supervisor -> server up        its Popen until its "local server ... up" line: the interpreter, its
                                   imports and nats-server ready
      supervisor's imports         a fresh interpreter importing what the supervisor imports (measured
                                   apart, in its own process: the part of the line above that is Python)
  init: next_attempt             the attempt asked of the ledger: waits for the ledger to answer (its
                                 tables opened or made, its consumer bound), then one round trip
    server up -> ledger root       the Ledger constructed: the catalog and the tables made or opened
    ledger root -> serving         its connection, the stream and the consumer ensured
  init: Emitter                  the spool opened, the publisher thread started
  init: the rest                 run_started sealed and spooled, the config, the current run
  log                            one step of 20 names
  finish: flush                  until JetStream acknowledged every event (the publisher's connect included)
  finish: ledger verdict         until the ledger committed them (its first commit: the tables' first files)
  finish: the rest               the spool closed (and pruned), the attachment released

`--code DIR`: the runledger code of another checkout (see bench.at_rest), for a before/after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from datetime import datetime
from pathlib import Path

from bench.at_rest import code_env

CHILD = """
    import json, sys, time
    t0 = time.perf_counter()
    import runledger
    t_import = time.perf_counter() - t0
    from runledger import core
    from runledger.ledger import local
    from runledger.ledger.emit import emitter, publisher

    spans = {}
    def timed(owner, attr, label):
        f = getattr(owner, attr)
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spans[label] = spans.get(label, 0.0) + time.perf_counter() - t
        setattr(owner, attr, wrapper)

    popen_at = []
    start = local._spawn_supervisor
    def start_supervisor(*a, **k):
        popen_at.append(time.time())
        return start(*a, **k)
    local._spawn_supervisor = start_supervisor
    timed(local, "attach", "init: attach")
    timed(core, "next_attempt", "init: next_attempt")
    timed(emitter.Emitter, "__init__", "init: Emitter")
    timed(emitter.Emitter, "flush", "finish: flush")
    timed(publisher.Publisher, "stop", "finish: ledger verdict")

    t = time.perf_counter()
    run = runledger.init(project="first", id="first", system_metrics=False)
    init_s = time.perf_counter() - t
    t = time.perf_counter()
    runledger.log({f"m{j}": j / 10 for j in range(20)})
    log_s = time.perf_counter() - t
    t = time.perf_counter()
    ok = run.finish()
    finish_s = time.perf_counter() - t
    print(json.dumps({"import runledger": t_import, "init": init_s, "log": log_s, "finish": finish_s, "ok": ok,
                      "popen_at": popen_at[0] if popen_at else None, **spans}))
"""

MARKS = {"server up": "local server of", "ledger root": "ledger root ", "serving": "ledger serving"}


def supervisor_marks(root: Path) -> dict[str, float]:
    """The wall-clock times of the supervisor's log lines that mark its phases."""
    out = {}
    log = root / "local" / "supervisor.log"
    for line in log.read_text().splitlines() if log.exists() else []:
        for mark, text in MARKS.items():
            if text in line and mark not in out:
                out[mark] = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return out


def one(tmp: Path, env: dict) -> dict:
    root = tmp / "root"
    env = {**env, "RUNLEDGER_ROOT": str(root)}
    try:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD)], env=env, capture_output=True, text=True,
                             timeout=300)
        if out.returncode:
            raise RuntimeError(out.stderr[-2000:])
        r = json.loads(out.stdout.strip().splitlines()[-1])
        marks = supervisor_marks(root)
        if r["popen_at"] and len(marks) == len(MARKS):
            r["  supervisor -> server up"] = marks["server up"] - r["popen_at"]
            r["  server up -> ledger root"] = marks["ledger root"] - marks["server up"]
            r["  ledger root -> serving"] = marks["serving"] - marks["ledger root"]
        r["init: the rest"] = r["init"] - sum(r.get(k, 0.0) for k in ("init: attach", "init: next_attempt", "init: Emitter"))
        r["finish: the rest"] = r["finish"] - r.get("finish: flush", 0.0) - r.get("finish: ledger verdict", 0.0)
        return r
    finally:
        subprocess.run([sys.executable, "-m", "runledger.tools.cli", "down", "--root", str(root)], env=env,
                       capture_output=True, timeout=120)


def python_start(env: dict) -> float:
    """A fresh interpreter importing what the supervisor imports (its share of `supervisor -> server up`)."""
    code = "import time; t = time.perf_counter(); import runledger.ledger.local, runledger.ledger.ingest.service; " \
           "print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    return float(out.stdout.strip())


ORDER = ["import runledger", "init", "init: attach", "  supervisor -> server up", "    supervisor's imports",
         "init: next_attempt", "  server up -> ledger root", "  ledger root -> serving", "init: Emitter",
         "init: the rest", "log", "finish", "finish: flush", "finish: ledger verdict", "finish: the rest"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--code", type=Path, help="the runledger code of another checkout (a before)")
    args = p.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="first-init-") as d:
        env = code_env(args.code, Path(d))
        for i in range(args.repeat):
            (Path(d) / str(i)).mkdir()
            r = one(Path(d) / str(i), env)
            r["    supervisor's imports"] = python_start(env)
            runs.append(r)
    load = os.getloadavg()[0]
    print(f"first init on a new root, {args.repeat} fresh processes; code: {args.code or 'this checkout'}; "
          f"{os.cpu_count()} CPUs, load {load:.1f}; all finished ok: {all(r['ok'] for r in runs)}")
    print(f"{'phase':32} {'median s':>9} {'min s':>7} {'max s':>7}")
    for k in ORDER:
        xs = [r[k] for r in runs if r.get(k) is not None]
        if xs:
            print(f"{k:32} {statistics.median(xs):>9.3f} {min(xs):>7.3f} {max(xs):>7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
