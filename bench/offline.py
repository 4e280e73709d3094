"""Never hang (issue 36, item 7), in seconds, in one command:

    python -m bench.offline [--repeats 3]

- `init` against an unreachable RUNLEDGER_NATS: a refused port (nothing listens on a free loopback
  port) and a blackholed address (10.255.255.1: packets go nowhere, no refusal comes back): seconds
  from the call to its return (it goes offline, spooling, with one line saying where), measured inside
  the script's own process;
- `notify --root` before any server exists (a root that had one: it waits for it), and `ui` on a taken
  port (it moves to the next free one): seconds from SIGINT to the process's exit, once it said it waits
  (notify) or serves (ui). A process still running WATCHDOG_S after the signal is killed and shown so.

Each a real process on a fresh root; tests/integration/test_never_hang.py asserts the same exits with a
generous watchdog, and the seconds are here.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runledger.ledger.bus.natsserver import free_port

REPO = Path(__file__).resolve().parent.parent
WATCHDOG_S = 30.0
BLACKHOLE = "nats://10.255.255.1:4222"

INIT = """
import time, runledger
t = time.perf_counter()
run = runledger.init(project="bench", system_metrics=False)
print(f"{time.perf_counter() - t:.3f}", flush=True)
run.finish()
"""


def env_for(root: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RUNLEDGER_NATS", "RUNLEDGER_CREDS")}
    return {**env, "RUNLEDGER_ROOT": str(root), "PYTHONPATH": str(REPO), **extra}


def init_s(nats_url: str) -> float:
    with tempfile.TemporaryDirectory() as d:
        done = subprocess.run([sys.executable, "-c", INIT], env=env_for(Path(d), RUNLEDGER_NATS=nats_url),
                              capture_output=True, text=True, timeout=600, cwd=REPO)
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        return float(done.stdout.split()[0])


def sigint_s(cmd: list[str], root: Path, ready) -> tuple[float | None, int | None]:
    """Start `cmd`, wait until `ready(output)`, send SIGINT; seconds until it exited, and its exit code."""
    log = root.parent / f"{root.name}.log"  # (beside the root: a file in it would make it no ledger root)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", *cmd, "--root", str(root)], cwd=REPO,
                                env=env_for(root), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not ready(log.read_text()):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} did not come up: {log.read_text()}")
            time.sleep(0.05)
        t = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(WATCHDOG_S)
            return time.perf_counter() - t, code
        except subprocess.TimeoutExpired:
            return None, None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def notify_s() -> tuple[float | None, int | None]:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "root"
        (root / "nats").mkdir(parents=True)  # a root that had a server: notify waits for it to come back
        routes = Path(d) / "routes.toml"
        routes.write_text(f'[[route]]\nname = "r"\nurl = "http://127.0.0.1:{free_port()}/json"\n')
        return sigint_s(["notify", "--routes", str(routes)], root, lambda out: "waiting for a server" in out)


def ui_s() -> tuple[float | None, int | None]:
    with tempfile.TemporaryDirectory() as d, socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        return sigint_s(["ui", "--port", str(port)], Path(d) / "root", lambda out: "http://" in out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    rows = [
        ("init, refused port (nothing listens)", "s to return", lambda: (init_s(f"nats://127.0.0.1:{free_port()}"), 0)),
        (f"init, blackholed address ({BLACKHOLE})", "s to return", lambda: (init_s(BLACKHOLE), 0)),
        ("notify --root, no server yet", "s SIGINT to exit", notify_s),
        ("ui on a taken port (moved to the next)", "s SIGINT to exit", ui_s),
    ]
    print(f"| case | measure | runs ({args.repeats}) | median | exit |\n|---|---|---|---|---|")
    for name, what, measure in rows:
        got = [measure() for _ in range(args.repeats)]
        secs = [s for s, _ in got]
        shown = ", ".join("killed" if s is None else f"{s:.2f}" for s in secs)
        med = statistics.median(s for s in secs if s is not None) if any(s is not None for s in secs) else float("nan")
        codes = sorted({c for _, c in got}, key=str)
        print(f"| {name} | {what} | {shown} | {med:.2f} | {', '.join(map(str, codes))} |", flush=True)


if __name__ == "__main__":
    main()
