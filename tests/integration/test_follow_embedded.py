"""The long-running readers of a root follow its embedded server (runledger.ledger.local) across its idle
stop and restart: the server stops once no client has used it for RUNLEDGER_IDLE_S and comes back on a
new port with the next `init`; `notify` and `agents` started with only `--root` take up their consumers
there and act on the next run's events without being restarted. And liveness: a run whose process was
SIGKILLed reads `crashed` in the `runs` view once its heartbeats stop; a finished one `finished`, a failed
one `failed` (the contract's RUN_STATES)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path


from runledger.ledger import local
from support import REPO
from support.embedded import WATCHDOG_S, embedded_env, idled_out, until
from support.reading import reader
from support.webhooks import Receiver

ALERTING_RUN = """
import runledger, sys
run = runledger.init(project="follow", name=sys.argv[1], system_metrics=False)
run.log({"loss": 1.0})
run.alert(sys.argv[1], "the run says so", level="WARN")
run.finish()
print(run.id)
"""


HOT_RUN = """
import runledger, sys
run = runledger.init(project="follow", name=sys.argv[1], system_metrics=False, health="marin")  # (grad norm > 2.0)
for step in range(5):
    run.log({"loss": 1.0, "grad_norm": 1e6}, step=step)
run.finish()
print(run.id)
"""


def run_to_end(code: str, root: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=embedded_env(root), cwd=REPO,
                          capture_output=True, text=True, timeout=WATCHDOG_S)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def start_cli(root: Path, log: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", *args, "--root", str(root)], cwd=REPO,
                            env=embedded_env(root), stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def servers_taken_up(log: Path) -> list[str]:
    """The servers a notify or agents process took up its consumer on, in order (its log's lines)."""
    return [line.split(" at ", 1)[1].split()[0].rstrip(",") for line in log.read_text().splitlines()
            if " at nats://" in line and ("notify: consumer" in line or "agents: consumer" in line)]


def stop(proc: subprocess.Popen) -> int | None:
    proc.terminate()
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def test_notify_delivers_the_alert_of_a_run_started_after_the_embedded_server_came_back_on_a_new_port(local_root, tmp_path):
    root = local_root
    receiver = Receiver().up()
    routes = tmp_path / "routes.toml"
    routes.write_text(f'[[route]]\nname = "all"\nurl = "http://127.0.0.1:{receiver.port}/json"\nkinds = ["alert"]\n')
    held = local.attach(root, idle_s=1)  # the server is up while notify starts (as a run would hold it)
    log = tmp_path / "notify.log"
    notify = start_cli(root, log, "notify", "--routes", str(routes))
    taken = None
    try:
        assert until(lambda: "notify: consumer" in log.read_text()), log.read_text()
        first = run_to_end(ALERTING_RUN, root, "before")
        assert until(lambda: len(receiver.keys("/json")) == 1), log.read_text()
        held.release()
        old_url, taken = idled_out(root)  # nothing holds it: it stops; notify keeps running
        second = run_to_end(ALERTING_RUN, root, "after")  # init starts the root's server again
        held = local.attach(root, idle_s=1)  # (its finish hands over and returns: the server held while notify follows)
        assert until(lambda: len(receiver.keys("/json")) == 2), log.read_text()
        urls = servers_taken_up(log)
        assert urls[0] == old_url and len(urls) >= 2 and urls[1] != old_url, urls  # the new port, taken up
        runs = sorted(body["run_id"] for body in receiver.kept["/json"].values())
        assert runs == sorted([first, second])
        assert notify.poll() is None, log.read_text()  # the same notify, never restarted
        assert "following it" in log.read_text()
        assert stop(notify) == 0, log.read_text()
    finally:
        held.release()
        if notify.poll() is None:
            notify.kill()
            notify.wait()
        if taken is not None:
            taken.close()
        receiver.down()


def test_the_agents_alert_on_a_run_started_after_the_embedded_server_came_back_on_a_new_port(local_root, tmp_path):
    root = local_root
    held = local.attach(root, idle_s=1)  # (held while the agents judge a run: its alert is stored at once)
    log = tmp_path / "agents.log"
    agents = start_cli(root, log, "agents")
    taken = None

    def alerted(run: str) -> bool:
        return reader(root).execute("select count(*) from alerts where run_id = ? and rule = 'grad_norm_high'",
                                    [run]).fetchone()[0] > 0
    try:
        assert until(lambda: "agents: consumer" in log.read_text()), log.read_text()
        first = run_to_end(HOT_RUN, root, "before")
        assert until(lambda: alerted(first)), log.read_text()
        held.release()
        old_url, taken = idled_out(root)  # nothing holds it: it stops; the agents keep running
        held = local.attach(root, idle_s=1)  # the root's server again, on another port
        second = run_to_end(HOT_RUN, root, "after")
        assert until(lambda: alerted(second)), log.read_text()
        urls = servers_taken_up(log)
        assert urls[0] == old_url and len(urls) >= 2 and urls[1] != old_url, urls
        assert agents.poll() is None, log.read_text()  # the same agents process, never restarted
        assert stop(agents) == 0, log.read_text()
    finally:
        held.release()
        if agents.poll() is None:
            agents.kill()
            agents.wait()
        if taken is not None:
            taken.close()


BEATING_RUN = """
import runledger, sys, time
run = runledger.init(project="states", name=sys.argv[1], system_metrics=False)
run.log({"loss": 1.0})
print(run.id, flush=True)
if sys.argv[1] == "failed":
    raise RuntimeError("the script fails")
if sys.argv[1] == "killed":
    while True:
        time.sleep(1)
run.finish()
"""


def test_a_sigkilled_run_reads_crashed_once_its_heartbeats_stop_a_finished_one_finished_a_failed_one_failed(local_root):
    root = local_root
    env = embedded_env(root, RUNLEDGER_HEARTBEAT_S="0.5", RUNLEDGER_IDLE_S="60")
    procs = {how: subprocess.Popen([sys.executable, "-c", BEATING_RUN, how], env=env, cwd=REPO, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True) for how in ("finished", "failed", "killed")}
    try:
        ids = {how: p.stdout.readline().strip() for how, p in procs.items()}
        assert all(ids.values()), {how: p.stderr.read() for how, p in procs.items() if p.poll() is not None}

        def beats(run: str) -> int:
            return reader(root).execute("select count(*) from heartbeats where run_id = ?", [run]).fetchone()[0]
        assert until(lambda: beats(ids["killed"]) >= 2)  # it beats while it lives
        procs["killed"].send_signal(signal.SIGKILL)
        procs["killed"].wait()
        for how in ("finished", "failed"):
            procs[how].wait(WATCHDOG_S)

        def states() -> dict:
            rows = reader(root).execute("select run_id, state from runs where project = 'states'").fetchall()
            return {how: dict(rows).get(run) for how, run in ids.items()}
        expected = {"finished": "finished", "failed": "failed", "killed": "crashed"}
        until(lambda: states() == expected)
        assert states() == expected
        assert beats(ids["killed"]) >= 2 and procs["killed"].returncode == -signal.SIGKILL
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
