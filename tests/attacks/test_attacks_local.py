"""Attacks on a root's embedded local default and on the processes the project starts (issue 33,
items 3 and 9).

Each test acts as the attacker: a damaged spool line or state file on the local disk, a secret in
the parent's environment or on the command line, another local user reading /proc. Then it asserts
the promise: damaged local state is quarantined with its reason and never stops the supervisor or
its ledger, `runledger down` stops every process of the root, and no secret reaches a child's argv
or environment, a log line, or a file other users can read.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil

from runledger.ledger import local, settings
from runledger.ledger.emit.sealing import seal
from support import REPO
from support.processes import runledger

SECRET = "s3cretPW-attack-33"
RUN = "dmg"


def good_lines(n: int, producer: str = "worker-0") -> list[bytes]:
    """`n` valid chained envelopes of one chain, as a producer's spool holds them."""
    out, prev = [], ""
    for seq in range(n):
        payload = {"config": {"n": seq}, "config_hash": "c0ffee", "token_budget": 1000, "schedule": {}}
        env, text = seal(RUN, producer, 0, seq, "run_started", payload, None, prev)
        out.append(text.encode())
        prev = env["hash"]
    return out


def root_processes(root: Path) -> list[psutil.Process]:
    """Every live process whose command line names the root: its nats-server, supervisor, ledger."""
    needle = str(root.resolve())
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(needle in a for a in (p.info["cmdline"] or ())):
                found.append(p)
        except psutil.Error:
            continue
    return found


def stored_of_run(root: Path) -> int:
    """Events of RUN the root's tables hold (0 before the ledger has made them)."""
    from runledger import queries
    from runledger.ledger.storage.paths import NotALedger

    try:
        return queries.connect(root).execute(f"select count(*) from events where run_id = '{RUN}'").fetchone()[0]
    except NotALedger:
        return 0


def supervisor_pid(root: Path) -> int:
    """The root's supervisor's pid, once it is up (`init` does not wait for the one it starts)."""
    deadline = time.monotonic() + 60
    while local.running_url(root) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return json.loads((local.local_dir(root) / "state.json").read_text())["pid"]


def test_damaged_spool_lines_are_quarantined_and_the_supervisor_stays_up(local_root):
    attached = local.attach(local_root)
    pid = supervisor_pid(local_root)
    good = good_lines(5)
    chain = settings.spool_dir(local_root) / RUN / "worker-0" / "0"
    chain.mkdir(parents=True)
    hostile = [b"this is not json", b'{"hello": "a JSON object, not an envelope"}', b'\xff\xfe{"seq": 2}',
               b"[1, 2, 3]", b'{"seq": "x", "kind": "alert", "event_id": "e", "hash": "h"}']
    lines = [good[0], hostile[0], good[1], hostile[1], good[2], hostile[2], hostile[3], good[3], hostile[4], good[4]]
    (chain / "seg-000000000000.jsonl").write_bytes(b"\n".join(lines) + b"\n" + b'{"seq": 5, "kind": "al')  # torn tail
    not_a_chain = settings.spool_dir(local_root) / "NOT A RUN" / "worker-0" / "0"  # a folder no producer could make
    not_a_chain.mkdir(parents=True)
    (not_a_chain / "seg-000000000000.jsonl").write_bytes(good[0] + b"\n")
    unreadable = settings.spool_dir(local_root) / "dmg2" / "worker-0" / "0"
    (unreadable / "seg-000000000000.jsonl").mkdir(parents=True)  # a segment that is a folder
    (local.local_dir(local_root) / "clients" / "x.lock").mkdir()  # a client's lease that is a folder
    try:
        deadline = time.monotonic() + 60
        while stored_of_run(local_root) < 5 and psutil.pid_exists(pid) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert psutil.pid_exists(pid), "the supervisor died"
        assert stored_of_run(local_root) == 5
        time.sleep(2 * local.POLL_S)  # a few more sweeps over the same spool
        assert psutil.pid_exists(pid) and supervisor_pid(local_root) == pid, "the supervisor died"
        assert local.running_url(local_root) == attached.url
        damaged = chain / "damaged"
        reasons = sorted(damaged.glob("*.reason"))
        assert len(reasons) == len(hostile) + 1, sorted(p.name for p in damaged.iterdir())
        kept = {r.with_suffix("").read_bytes().rstrip(b"\n") for r in reasons}
        assert set(hostile) | {b'{"seq": 5, "kind": "al'} == kept
        assert all(r.read_text().strip() for r in reasons)
        log_text = (local.local_dir(local_root) / "supervisor.log").read_text(errors="replace")
        assert "Traceback" not in log_text, log_text[-3000:]
        assert log_text.count("damaged") >= 1
        assert log_text.count("dmg2/worker-0/0 cannot be opened") == 1  # logged once, not every sweep
        assert list((not_a_chain / "damaged").glob("*.reason"))  # another chain's event, in this chain's folder
        assert list((local.local_dir(local_root) / "damaged").glob("x.lock.*.reason"))
    finally:
        attached.release()
    r = runledger("down", "--root", str(local_root), timeout=60)
    assert r.returncode == 0, r.stderr
    assert root_processes(local_root) == []


def test_down_stops_every_process_of_the_root_whose_state_files_are_damaged(local_root):
    attached = local.attach(local_root)
    attached.release()
    assert len(root_processes(local_root)) >= 2  # the supervisor (with its ledger) and nats-server
    os.kill(supervisor_pid(local_root), signal.SIGKILL)  # the supervisor is already dead ...
    time.sleep(0.5)
    d = local.local_dir(local_root)
    for f in (d / "state.json", d / "supervisor.lock", settings.nats_dir(local_root) / "url",
              settings.nats_dir(local_root) / "nats-server.pid"):
        f.write_bytes(b"\x00garbage{")  # ... and every state file is damaged
    assert root_processes(local_root), "nats-server should still run"
    r = runledger("down", "--root", str(local_root), timeout=60)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert root_processes(local_root) == []


def test_a_live_supervisor_with_damaged_state_files_is_stopped_by_down(local_root):
    attached = local.attach(local_root)
    attached.release()
    d = local.local_dir(local_root)
    (d / "supervisor.lock").write_bytes(b"not json")  # its pid is no longer readable there
    (d / "state.json").write_bytes(b"{")
    r = runledger("down", "--root", str(local_root), timeout=60)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert root_processes(local_root) == []


# ------------------------------------------------------------------------------------ secrets


def secrets_in(pids: list[int]) -> list[str]:
    """Which of these processes show SECRET in their argv or environment (as /proc shows them)."""
    found = []
    for pid in pids:
        for part in ("cmdline", "environ"):
            try:
                if SECRET.encode() in Path(f"/proc/{pid}/{part}").read_bytes():
                    found.append(f"{pid} {part}")
            except OSError:
                continue
    return found


def test_the_local_supervisor_and_its_server_get_no_secret(local_root, monkeypatch):
    monkeypatch.setenv(settings.NATS_ENV, f"nats://ledger:{SECRET}@127.0.0.1:1")  # the parent's remote, with its password
    attached = local.attach(local_root)  # (the embedded default is asked for: the remote is not used)
    try:
        pids = [p.pid for p in root_processes(local_root)]
        assert len(pids) >= 2
        assert secrets_in(pids) == []
    finally:
        attached.release()


def test_demo_pieces_get_no_secret_from_the_parent(tmp_path, monkeypatch):
    from rich.console import Console

    from runledger.tools.demo import QUICK, Demo

    monkeypatch.setenv(settings.NATS_ENV, f"nats://ledger:{SECRET}@127.0.0.1:1")
    creds = tmp_path / "elsewhere.creds"
    creds.write_text(f"nats://ledger:{SECRET}@127.0.0.1:1\n")
    monkeypatch.setenv(settings.CREDS_ENV, str(creds))
    demo = Demo(tmp_path / "demo", QUICK, Console(file=open(os.devnull, "w")))
    (tmp_path / "demo").mkdir()
    demo.start()
    try:
        time.sleep(1.0)
        pids = [p.pid for p in demo.procs if p.poll() is None]
        assert pids, "the demo's ledger and agents did not start"
        assert secrets_in(pids + [demo.nats.proc.pid]) == []
    finally:
        demo.stop()


def test_a_password_on_the_command_line_is_warned_about_and_never_echoed(tmp_path):
    r = runledger("status", "--root", str(tmp_path / "missing"), "--nats", f"nats://ledger:{SECRET}@127.0.0.1:1")
    assert r.returncode == 2
    assert SECRET not in r.stderr + r.stdout
    assert any("warning" in line and "--nats" in line for line in r.stderr.splitlines()), r.stderr
    r = runledger("ledger", "serve", "--root", str(tmp_path), "--nats", "nats://127.0.0.1:1", "--catalog",
                  f"postgresql://ledger:{SECRET}@127.0.0.1:1/db", timeout=60)
    assert r.returncode == 2 and SECRET not in r.stderr + r.stdout, r.stderr
    assert any("warning" in line and "--catalog" in line for line in r.stderr.splitlines()), r.stderr
    creds = tmp_path / "loose.creds"
    creds.write_text(f"nats://ledger:{SECRET}@127.0.0.1:1\n")
    creds.chmod(0o644)
    r = runledger("status", "--root", str(tmp_path / "missing"), "--creds", str(creds))
    assert r.returncode == 2 and SECRET not in r.stderr + r.stdout, r.stderr
    assert any("warning" in line and "readable by other users" in line for line in r.stderr.splitlines()), r.stderr


def test_a_catalog_uri_with_a_password_is_kept_in_a_private_file(tmp_path):
    from runledger.ledger.ingest import partitions
    from runledger.ledger.storage.paths import CATALOG_URI_FILE

    root = tmp_path / "root"
    uri = f"sqlite:///{tmp_path / 'cat.db'}?password_like={SECRET}"
    partitions.use_catalog(root, uri)
    mode = stat.S_IMODE((root / CATALOG_URI_FILE).stat().st_mode)
    assert mode & 0o077 == 0, oct(mode)


def test_ledger_serve_reads_its_catalog_from_a_private_file(tmp_path, nats_server):
    cat = tmp_path / "catalog.uri"
    cat.write_text(f"sqlite:///{tmp_path / 'cat.db'}\n")
    cat.chmod(0o600)
    from runledger.ledger.storage.paths import CATALOG_URI_FILE

    root = tmp_path / "root"
    p = subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "ledger", "serve", "--root", str(root), "--nats",
                          nats_server.url, "--catalog-file", str(cat)], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (root / CATALOG_URI_FILE).exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert p.poll() is None, p.communicate()[1][-2000:]
        assert str(cat) in " ".join(psutil.Process(p.pid).cmdline())
    finally:
        p.terminate()
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err[-2000:]
    assert "warning" not in err.lower()


def test_a_stream_purged_under_the_embedded_default_stops_it_once_and_says_why(local_root):
    """The embedded default has no access control: anyone on the machine can purge its stream. Its ledger
    then stops for good with one line (issue 33, item 5); the supervisor stops with it instead of dying
    or restarting it in a loop, and the next `init` on the root is refused with that line."""
    import asyncio

    import nats
    import pytest

    import runledger
    from runledger.ledger.contract.events import STREAM

    run = runledger.init(project="p", id="purged", config={"lr": 0.1})
    for step in range(5):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    run.finish()
    pid = supervisor_pid(local_root)
    deadline = time.monotonic() + 60
    while stored_all(local_root) < 7 and time.monotonic() < deadline:  # run_started, 5 metrics, run_finished
        time.sleep(0.2)

    async def purge(url: str) -> None:
        nc = await nats.connect(url)
        await nc.jetstream().purge_stream(STREAM)
        await nc.close()

    attached = local.attach(local_root)  # a client keeps it from stopping for idleness meanwhile
    try:
        asyncio.run(purge(attached.url))
        deadline = time.monotonic() + 60
        while not gone(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert gone(pid), "the supervisor kept on"
    finally:
        attached.release()
    log_text = (local.local_dir(local_root) / "supervisor.log").read_text()
    assert "stopped for good" in log_text and "Traceback" not in log_text, log_text[-2000:]
    with pytest.raises(RuntimeError, match="purged") as refused:
        local.attach(local_root, timeout=10)
    assert "\n" not in str(refused.value)
    assert not [p for p in root_processes(local_root) if "nats-server" in (p.info["cmdline"] or [""])[0]], \
        "the supervisor left its nats-server running"


def gone(pid: int) -> bool:
    """The process ended (a zombie its spawner, this test's process, has not reaped has ended too)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def stored_all(root: Path) -> int:
    """Every event the root's tables hold (0 before the ledger has made them)."""
    from runledger import queries
    from runledger.ledger.storage.paths import NotALedger

    try:
        return queries.connect(root).execute("select count(*) from events").fetchone()[0]
    except NotALedger:
        return 0
