"""Seconds each long-running command takes to stop on SIGTERM and on SIGINT, in one command:

    python -m bench.stop [--repeats 3]

Each command runs as a real process (`python -m runledger.tools.cli ...`, or a script calling `runledger.init`)
against a fresh local nats-server and root each time; once it is up (its start line, or for `agents`, which
logs none, its consumer on the server), it gets the signal, and the seconds until it has exited on its own are printed with its
exit code. A process still running WATCHDOG_S after the signal is killed and shown as such.
tests/integration/test_stop.py runs the same starts (`start`, `stop`) as its sweep.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from runledger.ledger.bus import jetstream as bus
from runledger.ledger import local
from runledger.ledger.contract.events import STREAM
from runledger.ledger.bus.natsserver import AGENTS_DURABLE, NatsServer, free_port

REPO = Path(__file__).resolve().parent.parent
WATCHDOG_S = 15.0  # a process not gone by then is killed (and counted as not stopping)
READY_S = 60.0  # how long a start may take (the embedded local server and ledger of runledger.init)
COMMANDS = ("notify", "ledger serve", "agents", "ui", "runledger.init")

INIT_SCRIPT = """
import time, runledger
run = runledger.init(project="stop", name="stop-run")
print("ready", flush=True)
step = 0
while True:
    runledger.log({"loss": 1.0 / (step + 1)}, step=step)
    step += 1
    time.sleep(0.05)
"""


@dataclass
class Started:
    name: str
    proc: subprocess.Popen
    log: Path
    root: Path


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "runledger.tools.cli", *args]


def start(name: str, work: Path, nats_url: str) -> Started:
    """Start `name` (one of COMMANDS) in `work`, on the server at `nats_url`, and wait until it is up."""
    root, log = work / "root", work / f"{name.replace(' ', '-')}.log"
    root.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RUNLEDGER_NATS", "RUNLEDGER_CREDS")}
    env["RUNLEDGER_ROOT"] = str(root)
    ready: str | None
    if name == "notify":
        routes = work / "routes.toml"
        routes.write_text(f'[[route]]\nname = "nobody"\nurl = "http://127.0.0.1:{free_port()}/hook"\n')
        argv, ready = _cli("notify", "--routes", str(routes), "--nats", nats_url), "notify: consumer"
    elif name == "ledger serve":
        argv, ready = _cli("ledger", "serve", "--root", str(root), "--nats", nats_url), "ledger serving"
    elif name == "agents":
        argv, ready = _cli("agents", "--root", str(root), "--nats", nats_url), None  # up: its consumer exists
    elif name == "ui":
        argv, ready = _cli("ui", "--root", str(root), "--nats", nats_url, "--port", "0"), "http://"
    elif name == "runledger.init":
        argv, ready = [sys.executable, "-c", INIT_SCRIPT], "ready"
    else:
        raise ValueError(f"no command {name!r}: one of {', '.join(COMMANDS)}")
    out = open(log, "ab")
    proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
    out.close()
    started = Started(name, proc, log, root)
    deadline = time.monotonic() + READY_S

    def up() -> bool:
        if ready is None:
            return asyncio.run(_has_consumer(nats_url, AGENTS_DURABLE))
        return ready in log.read_text(errors="replace")

    while not up() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if proc.poll() is not None or not up():
        tail = log.read_text(errors="replace")[-600:]
        stop_hard(started)
        raise RuntimeError(f"{name} did not come up (exit {proc.poll()}): {tail}")
    return started


async def _has_consumer(nats_url: str, durable: str) -> bool:
    nc = await bus.connect(nats_url)
    try:
        await nc.jetstream().consumer_info(STREAM, durable)
        return True
    except Exception:  # (not yet: no stream, or no consumer)
        return False
    finally:
        await nc.close()


def stop(started: Started, sig: signal.Signals) -> tuple[float | None, int]:
    """Send `sig`; (seconds until the process exited on its own or None if the watchdog killed it, exit code)."""
    t0 = time.monotonic()
    started.proc.send_signal(sig)
    try:
        code = started.proc.wait(WATCHDOG_S)
        return time.monotonic() - t0, code
    except subprocess.TimeoutExpired:
        stop_hard(started)
        return None, started.proc.returncode


def stop_hard(started: Started) -> None:
    if started.proc.poll() is None:
        started.proc.kill()
        started.proc.wait()
    local.down(started.root)  # (runledger.init's embedded server and ledger, if it started them)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in COMMANDS:
            for sig in (signal.SIGTERM, signal.SIGINT):
                runs = []
                for i in range(args.repeats):
                    work = Path(tmp) / f"{name.replace(' ', '-')}-{sig.name}-{i}"
                    server = NatsServer(work / "nats").start()
                    try:
                        started = start(name, work, server.url)
                        seconds, code = stop(started, sig)
                        stop_hard(started)
                    finally:
                        server.stop()
                    runs.append((None if seconds is None else round(seconds, 2), code))
                figures[f"{name} {sig.name}"] = {"seconds": [s for s, _ in runs], "exit": sorted({c for _, c in runs})}
                print(json.dumps({f"{name} {sig.name}": figures[f"{name} {sig.name}"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
