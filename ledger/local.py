"""The embedded local default: one nats-server and one ledger per root, started on demand, shared by
every process that logs to the root, stopped when no one has used them for a while.

`attach(root)` is what `runledger.init` calls when no server is configured. Under the root's start
lock it registers the calling process as a client (a lock file that the OS frees when the process
dies), starts the root's supervisor unless one runs, and returns the server's URL (`init` passes
wait=False: it gets a `LocalUrl`, read by its publisher once the server is up, and never waits). The
supervisor (`python -m runledger.ledger.local ROOT`, detached from the caller) starts nats-server
(`natsserver.up`, or takes the one `runledger nats up` left running), serves the ledger
(`service.serve`) and, every POLL_S, sends what producers left in the root's spool (a killed one's,
and a finished run's: `finish` hands its chain over; `emitter.send_leftovers`), looks at its clients,
and lets go of the spool lines of closed chains the ledger has stored since they closed
(`emitter.prune_stored`: a chain not stored yet is asked again after 0.5 s, then twice as long each
time). Once no client has been alive for `idle_s` and the ledger has taken every message, it
stops: what the spool still holds is sent and taken first (a last sweep, at most LAST_SWEEP_S), the ledger
drains, the server it started stops, and it exits. `down(root)` stops it now, the same way.

Starting and stopping happen under the start lock, so a process attaching while the supervisor stops
waits, then starts a new one: never two at a time.

Layout: {root}/local/start.lock, supervisor.lock (held by the running supervisor), state.json
({"pid", "url"}), clients/*.lock, owns-nats (the server is the supervisors' to stop), supervisor.log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from runledger.ledger.storage import locks, paths
from runledger.ledger.bus import natsserver
from runledger.ledger import redact, settings
from runledger.ledger.contract.events import STREAM

log = logging.getLogger(__name__)

IDLE_S = float(os.environ.get("RUNLEDGER_IDLE_S", 60))  # no client alive this long: the supervisor stops
POLL_S = 1.0  # how often the supervisor looks at its clients and the spool
LAST_SWEEP_S = 20.0  # stopping (idle, SIGTERM, `down`): at most this long to store what the spool holds first
START_TIMEOUT_S = 60.0  # nats-server and the ledger up
SPAWNED = "spawned"  # in local/: `{pid} {unix time}` of the supervisor last started


def local_dir(root: str | Path) -> Path:
    return Path(root).resolve() / "local"


@dataclass
class Attachment:
    """A process's use of its root's local server: `url` (a `LocalUrl` when the server may be starting),
    held until `release()` (or its death)."""

    url: "str | LocalUrl"
    lease: locks.Lock
    root: Path | None = None
    idle_s: float = IDLE_S

    def release(self) -> None:
        """Let go of the lease. A supervisor that died meanwhile (killed) is started again, so that what
        this client handed over is stored now rather than at the next `init` (`revive`)."""
        self.lease.release()
        self.lease.path.unlink(missing_ok=True)
        if self.root is not None:
            revive(self.root, self.idle_s)


class LocalUrl:
    """The URL of a root's local server, read when called: None while its supervisor is starting (an
    Emitter's publisher takes this, so `init` never waits for the server it started)."""

    def __init__(self, root: str | Path) -> None:
        self.root = root

    def __call__(self) -> str | None:
        return running_url(self.root)

    def __repr__(self) -> str:
        return f"LocalUrl({str(self.root)!r})"


def attach(root: str | Path, idle_s: float = IDLE_S, timeout: float = START_TIMEOUT_S, wait: bool = True) -> Attachment:
    """Register this process as a client of the root's local server and ledger, starting them unless
    they run; returns the server's URL with the client's lease. With `wait=False` a supervisor is only
    started (it comes up meanwhile) and the URL is a `LocalUrl`, read when needed."""
    d = local_dir(root)
    stopped = halted(root)
    if stopped:  # its ledger stopped for good (a lost stream): a new supervisor would only die at once
        raise RuntimeError(f"the local runledger server of {root} does not start: {stopped}")
    with locks.hold(d / "start.lock", f"the local server of {root}", wait_s=timeout):
        lease = locks.hold(d / "clients" / f"{os.getpid()}-{secrets.token_hex(4)}.lock", "a client")
        try:
            _name_warehouse(root)
            url = running_url(root)
            if url is None:  # (one spawned meanwhile and still starting is waited for, never doubled: the
                # second would find the first's supervisor.lock taken and exit, and this caller with it)
                spawned = None if starting(root) else _spawn_supervisor(root, idle_s)
                url = _wait_up(root, spawned, timeout) if wait else LocalUrl(root)
        except BaseException:
            lease.release()
            raise
    return Attachment(url, lease, Path(root), idle_s)


def _name_warehouse(root: str | Path) -> None:
    """$RUNLEDGER_WAREHOUSE (s3://bucket/prefix) names the root's warehouse before its ledger starts, with the
    AWS_* credentials kept in the root's 0600 file for the supervisor (runledger.ledger.storage.objects): the
    embedded default's tables and blobs then live in the bucket. A root keeps the warehouse its tables were
    made in: another is refused (RuntimeError, one line)."""
    from runledger.ledger.storage import objects

    named = os.environ.get(settings.WAREHOUSE_ENV)
    if named:
        try:
            objects.use_warehouse(Path(root), named)
        except ValueError as err:
            raise RuntimeError(f"${settings.WAREHOUSE_ENV}: {err}") from None


def revive(root: str | Path, idle_s: float = IDLE_S) -> bool:
    """Start the root's supervisor if none runs or starts (it was killed, perhaps while a client attached
    and took the URL of a supervisor dying), and someone left events in the spool for it; True if one
    was started. Never waits: the start lock busy means someone else is starting or stopping one."""
    if running_url(root) is not None or starting(root) or halted(root) or not _spooled(root):
        return False
    try:
        with locks.hold(local_dir(root) / "start.lock", f"the local server of {root}"):
            if running_url(root) is not None or starting(root):
                return False
            _spawn_supervisor(root, idle_s)
            return True
    except locks.Busy:
        return False


def _spooled(root: str | Path) -> bool:
    """Whether the root's spool holds any chain's files."""
    return any(settings.spool_dir(root).glob("*/*/*/seg-*"))


def halted(root: str | Path) -> str | None:
    """Why the root's ledger stopped for good (`service.StreamLost`, recorded in `ledger.halted`), or None;
    read here without loading the service, which a logging process never needs."""
    try:
        return (Path(root) / paths.HALTED_FILE).read_text().strip() or None
    except OSError:
        return None


def running_url(root: str | Path) -> str | None:
    """The URL of the root's local server if its supervisor runs, else None."""
    d = local_dir(root)
    if not locks.is_held(d / "supervisor.lock"):
        return None
    try:
        return json.loads((d / "state.json").read_text())["url"]
    except (OSError, ValueError, KeyError):
        return None


def _spawn_supervisor(root: str | Path, idle_s: float) -> subprocess.Popen:
    """Start the root's supervisor, detached, without waiting for it (under the start lock); its pid
    goes in local/spawned, so that a process attaching while it starts does not start another."""
    d = local_dir(root)
    d.mkdir(parents=True, exist_ok=True)
    (d / "state.json").unlink(missing_ok=True)
    with open(d / "supervisor.log", "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "runledger.ledger.local", str(Path(root).resolve()), "--idle-s", str(idle_s)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                env=settings.child_env(PYTHONPATH=_source_path()))
    (d / SPAWNED).write_text(f"{proc.pid} {time.time()}\n")
    return proc


def starting(root: str | Path) -> bool:
    """Whether a supervisor spawned for the root (`_spawn_supervisor`) is still starting: alive (not a
    zombie its spawner has not reaped), a supervisor of this root, spawned less than START_TIMEOUT_S ago."""
    try:
        pid, at = (local_dir(root) / SPAWNED).read_text().split()
        if time.time() - float(at) > START_TIMEOUT_S:
            return False
        pid = int(pid)
    except (OSError, ValueError):
        return False
    import psutil

    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE and _is_supervisor(p.cmdline(), Path(root).resolve())
    except psutil.Error:  # gone, or not this user's
        return False


def _wait_up(root: str | Path, spawned: subprocess.Popen | None, timeout: float) -> str:
    """The URL of the root's supervisor once it is up: the one this caller `spawned`, or one another
    process spawned that is still starting (None). Raises if it ends first, or is not up in `timeout`."""
    d = local_dir(root)
    deadline = time.monotonic() + timeout
    while (url := running_url(root)) is None:
        if spawned.poll() is not None if spawned is not None else not starting(root):
            code = f" with {spawned.returncode}" if spawned is not None else ""
            raise RuntimeError(f"the local runledger server of {root} exited{code}; see {d / 'supervisor.log'}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the local runledger server of {root} did not start within {timeout:.0f}s; see {d / 'supervisor.log'}")
        time.sleep(0.05)
    return url


def _source_path() -> str:
    """PYTHONPATH for the supervisor: where this package is, ahead of the caller's."""
    here = str(Path(__file__).resolve().parent.parent)
    return os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)


def live_clients(root: str | Path) -> int:
    """Clients still alive; the lease files of dead ones are removed."""
    alive = 0
    for lease in (local_dir(root) / "clients").glob("*.lock"):
        try:
            if locks.is_held(lease):
                alive += 1
            else:
                lease.unlink(missing_ok=True)
        except OSError as err:  # not a lock file (a folder, unreadable): no client's, and never fatal
            quarantine(root, lease, f"not a client's lease file: {err}")
    return alive


def quarantine(root: str | Path, path: Path, reason: str) -> None:
    """Move a damaged state file of the root aside into local/damaged/, beside a .reason file, and log
    it (once: it is no longer where it was)."""
    aside = local_dir(root) / "damaged"
    aside.mkdir(parents=True, exist_ok=True)
    name = f"{path.name}.{time.time_ns()}"
    try:
        os.replace(path, aside / name)
    except OSError as err:
        reason += f" (and it could not be moved aside: {err})"
    (aside / f"{name}.reason").write_text(reason + "\n")
    log.warning("%s: %s; moved to %s", path, reason, aside / name)


def down(root: str | Path, timeout: float = 60.0) -> bool:
    """Stop everything the root's embedded default started: its supervisor (the ledger in it drains)
    and the nats-server a supervisor started. The processes are found by their command lines, not by
    the root's state files, so a damaged state file or a supervisor already dead leaves nothing
    running. True if anything ran."""
    d = local_dir(root)
    if not d.is_dir():  # no supervisor ever ran here
        return False
    with locks.hold(d / "start.lock", f"the local server of {root}", wait_s=timeout):  # (no attach meanwhile)
        # a supervisor still starting: up first, so that it stops in order (its last sweep); state.json, written
        # once it is up (and there even if damaged since), says it no longer starts
        deadline = time.monotonic() + timeout
        while starting(root) and not (d / "state.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        supervisors = _stop(_processes(root, _is_supervisor), timeout)
        servers = []
        if (d / "owns-nats").exists():  # a server a supervisor started and could not stop (it died)
            natsserver.down(root)
            servers = _stop(_processes(root, _is_server), timeout)  # (its pid file damaged: found by its config)
            (d / "owns-nats").unlink(missing_ok=True)
        (d / "state.json").unlink(missing_ok=True)
    return bool(supervisors or servers)


def _stop(procs: list, timeout: float) -> list:
    """SIGTERM `procs`, wait up to `timeout` for them to end (a zombie has ended), then SIGKILL."""
    import psutil

    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    deadline = time.monotonic() + timeout
    while (alive := [p for p in procs if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in alive:
        log.warning("pid %d (%s) did not stop within %.0fs: killed", p.pid, " ".join(p.info["cmdline"]), timeout)
        with contextlib.suppress(psutil.Error):
            p.kill()
    return procs


def _alive(p) -> bool:
    import psutil

    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # gone
        return False


def _processes(root: str | Path, matches) -> list:
    """This user's live processes whose command line `matches(cmdline, root)`."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and matches(p.info["cmdline"] or [], Path(root).resolve()):
                found.append(p)
        except psutil.Error:
            continue
    return found


def _is_supervisor(cmdline: list[str], root: Path) -> bool:
    return "runledger.ledger.local" in cmdline and str(root) in cmdline


def _is_server(cmdline: list[str], root: Path) -> bool:
    conf = settings.nats_dir(root)
    return bool(cmdline) and Path(cmdline[0]).name.startswith("nats-server") and any(
        a.startswith(f"{conf}{os.sep}") for a in cmdline)


# ------------------------------------------------------------------------------------ the supervisor


async def _pending(nats_url: str) -> int:
    """Messages the ledger has not yet acknowledged (0 when it has taken every one)."""
    from runledger.ledger.bus import jetstream as bus
    from runledger.ledger.ingest.service import DURABLE

    nc = await bus.connect(nats_url, name="local-supervisor", max_reconnect_attempts=0)
    try:
        info = await nc.jetstream().consumer_info(STREAM, DURABLE)
        return info.num_pending + info.num_ack_pending
    except Exception:  # no stream or consumer yet: nothing was published
        return 0
    finally:
        await nc.close()


async def supervise(root: Path, idle_s: float = IDLE_S) -> None:
    """Serve the root's local server and ledger until idle (see the module docstring) or SIGTERM."""
    from runledger.ledger.emit import emitter
    from runledger.ledger.ingest import service

    d = local_dir(root)
    me = locks.hold(d / "supervisor.lock", f"the local server of {root}", wait_s=locks.PROBE_S)
    owned = d / "owns-nats"  # a server a supervisor started (a killed one's is taken over); one `nats up` started stays up
    ours = natsserver.running_url(root) is None or owned.exists()
    url = natsserver.up(root)
    if ours:
        owned.touch()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ours:  # its own server's folder lost: the new stream adopted, said in one line (never unable to start)
        from runledger.ledger.ingest.adoption import adopt_if_lost
        await adopt_if_lost(root, url)
    ledger_stop = asyncio.Event()  # (set after a last sweep: `stop` may come from SIGTERM, `runledger down`)
    ledger = asyncio.create_task(service.serve(root, url, ledger_stop))
    tmp = d / f".state.{os.getpid()}"
    tmp.write_text(json.dumps({"pid": os.getpid(), "url": url}))
    os.replace(tmp, d / "state.json")
    log.info("local server of %s up at %s (ledger pid %d)", root, url, os.getpid())
    idle_since = time.monotonic()
    start_lock = None
    unopenable: set = set()  # spool chains that cannot be opened (logged once)
    not_stored: dict = {}  # spool chains the ledger had not stored when asked (emitter.prune_stored)
    sweep_failed = ""  # the last failure of the spool sweep (logged when it changes)
    while not stop.is_set() and not ledger.done():
        try:
            await asyncio.wait_for(stop.wait(), POLL_S)
        except asyncio.TimeoutError:
            pass
        try:
            if await asyncio.to_thread(emitter.send_leftovers, settings.spool_dir(root), url, unopenable=unopenable):
                idle_since = time.monotonic()  # (a run handed over counts as a client: idle from when it was sent)
            # closed chains the ledger stored since: their spool lines go
            await asyncio.to_thread(emitter.prune_stored, settings.spool_dir(root), url, not_stored)
        except Exception as err:  # damaged local state: the supervisor and its ledger go on
            if str(err) != sweep_failed:
                log.warning("sending the spool's leftovers failed (tried again each %.0fs): %s", POLL_S, err)
            sweep_failed = str(err)
        try:  # a process attaching now holds it: look again next time
            start_lock = locks.hold(d / "start.lock", "")
        except locks.Busy:
            continue
        if live_clients(root):
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= idle_s and await _pending(url) == 0:
            log.info("no client for %.0fs and nothing pending: stopping", idle_s)
            (d / "state.json").unlink(missing_ok=True)
            break  # keeping the start lock until this process is gone
        start_lock.release()
        start_lock = None
    stop.set()
    if not ledger.done():  # a last sweep: what finished (handed-over) or killed runs left is stored before it stops
        try:
            await asyncio.wait_for(_last_sweep(root, url, unopenable), LAST_SWEEP_S)
        except Exception as err:  # (a timeout too: what is left stays in the spool, sent by the next supervisor)
            log.warning("the last sweep of the spool did not finish (%s): what is left is sent on the next start",
                        type(err).__name__)
    ledger_stop.set()
    try:
        await ledger
    except locks.Busy as err:  # another ledger serves this root: it takes the messages
        log.warning("%s", err)
    except service.StreamLost as err:  # said and recorded by the ledger; attach() refuses the root from now on
        log.error("the ledger stopped for good: %s", err)
    if ours:
        natsserver.down(root)
        owned.unlink(missing_ok=True)
    (d / "state.json").unlink(missing_ok=True)
    me.release()


async def _last_sweep(root: Path, url: str, unopenable: set) -> None:
    """Send what the spool holds unsent, and wait until the ledger has taken every message."""
    from runledger.ledger.emit import emitter

    await asyncio.to_thread(emitter.send_leftovers, settings.spool_dir(root), url, unopenable=unopenable,
                            timeout=LAST_SWEEP_S / 2)
    while await _pending(url):
        await asyncio.sleep(0.1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m runledger.ledger.local", description="the supervisor of a root's local server")
    p.add_argument("root", type=Path)
    p.add_argument("--idle-s", type=float, default=IDLE_S)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    redact.install()  # (supervisor.log: a URL's password written as ***)
    try:
        asyncio.run(supervise(args.root, args.idle_s))
    except locks.Busy as err:  # another supervisor was started meanwhile: it serves the root
        log.warning("%s", err)


if __name__ == "__main__":
    main()
