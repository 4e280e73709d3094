"""Never hang: `init` with a server that does not answer goes offline at once (one line saying where its
events are) and stops on Ctrl-C; `notify` with no server yet and `ui` on a taken port stop on SIGINT and
SIGTERM. Each process must exit on its own: the watchdog (WATCHDOG_S) is generous, the seconds are bench/'s."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from support import REPO
from support.processes import free_port

WATCHDOG_S = 15

SCRIPT = """
import runledger, sys
run = runledger.init(project="p", system_metrics=False)
run.log({"loss": 1.0})
print("logging", flush=True)  # (after a first step: the signal may come at once)
i = 1
while True:
    run.log({"loss": 1.0 / (i + 1)})
    i += 1
"""


def stops_on_its_own(proc: subprocess.Popen, sig: int) -> int | None:
    proc.send_signal(sig)
    try:
        return proc.wait(WATCHDOG_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def test_init_with_a_dead_server_goes_offline_keeps_logging_and_stops_on_ctrl_c(tmp_path):
    env = {**os.environ, "RUNLEDGER_NATS": f"nats://127.0.0.1:{free_port()}", "RUNLEDGER_ROOT": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "logging"
        code = stops_on_its_own(proc, signal.SIGINT)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code is not None, "init/log ignored Ctrl-C"
    offline = [line for line in err.splitlines() if "offline" in line]
    assert len(offline) == 1 and str(tmp_path / "spool") in offline[0] and "runledger sync" in offline[0], err
    [segment] = (tmp_path / "spool").glob("*/main/0/seg-*.jsonl")
    kinds = [line.split('"kind":"')[1].split('"')[0] for line in segment.read_text().splitlines()]
    logged = [k for k in kinds if k != "chain_head"]  # (with signed heads on, the head sealed at close follows its finish)
    assert logged[0] == "run_started" and "metrics" in logged and logged[-1] == "run_finished"
    assert kinds[-1] in ("run_finished", "chain_head")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_notify_with_no_server_yet_stops_on_a_signal(tmp_path, sig):
    routes = tmp_path / "routes.toml"
    routes.write_text(f'[[route]]\nname = "r"\nurl = "http://127.0.0.1:{free_port()}/json"\n')
    (tmp_path / "nats").mkdir()  # a root that had a server: notify waits for it to come back
    log = open(tmp_path / "notify.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "notify", "--routes", str(routes),
                             "--root", str(tmp_path)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env={k: v for k, v in os.environ.items() if k not in ("RUNLEDGER_NATS", "RUNLEDGER_CREDS")})
    try:
        import time

        deadline = time.monotonic() + 60
        while "waiting for a server" not in (tmp_path / "notify.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stops_on_its_own(proc, sig) == 0, (tmp_path / "notify.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ui_on_a_taken_port_moves_to_the_next_and_stops_on_a_signal(tmp_path, sig):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "ui", "--root", str(tmp_path), "--port", str(port)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said = proc.stderr.readline()
        address = proc.stdout.readline()
        assert f"port {port} is taken" in said, said
        moved = int(said.rsplit("serving on ", 1)[1].split()[0])
        assert moved != port and f":{moved}/" in address
        assert stops_on_its_own(proc, sig) == 0
    finally:
        taken.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("sig,partitions", [(signal.SIGINT, "1"), (signal.SIGTERM, "1"), (signal.SIGTERM, "2")])
def test_ledger_serve_stopped_while_it_opens_its_root_exits_cleanly(tmp_path, sig, partitions):
    import time

    root = tmp_path / "root"  # (no server listens at the URL: the ledger opens its root, then waits for one)
    proc = subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "ledger", "serve", "--root", str(root), "--nats",
                             f"nats://127.0.0.1:{free_port()}", "--partitions", partitions], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60  # (signalled the moment the root appears: its first file is being written)
        while not root.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        assert proc.poll() is None
        assert stops_on_its_own(proc, sig) == 0, proc.communicate()[1][-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
