"""s3: a real S3 server for the tests of a warehouse on object storage (tests/support: every helper defined once).

OpenStack Swift (PyPI `swift`) with its `s3api` middleware and `tempauth`, on loopback: one proxy and one
account, container and object server each, a one-device ring of one replica, its data in a temp dir (the
object server keeps metadata in xattrs: /tmp's file system has them). Swift runs from its own virtual
environment (eventlet monkey-patches whatever imports it), `make s3` installs it in `.venv-s3`
(`RUNLEDGER_SWIFT_VENV` names another); the tests that need it are skipped when it is not there.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from runledger.ledger.bus.natsserver import free_port

REPO = Path(__file__).resolve().parents[2]
SWIFT_VENV = Path(os.environ.get("RUNLEDGER_SWIFT_VENV", REPO / ".venv-s3"))
ACCESS_KEY = "test:tester"  # tempauth's account:user; s3api takes it as the access key id
SECRET_KEY = "testing"
REGION = "us-east-1"

SERVERS = ("account", "container", "object")


def _xattrs(folder: str) -> bool:
    """Whether files in `folder` take user xattrs (Swift's object server keeps its metadata there)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder) as f:
            os.setxattr(f.name, "user.runledger", b"1")
        return True
    except OSError:
        return False


def available() -> bool:
    return (SWIFT_VENV / "bin" / "swift-proxy-server").exists()


def _server_conf(kind: str, port: int, devices: Path, swift_dir: Path) -> str:
    return f"""[DEFAULT]
devices = {devices}
mount_check = false
bind_ip = 127.0.0.1
bind_port = {port}
workers = 0
swift_dir = {swift_dir}
log_level = WARNING
log_address = /nonexistent

[pipeline:main]
pipeline = {kind}-server

[app:{kind}-server]
use = egg:swift#{kind}
"""


PROXY_PIPELINE = ("catch_errors gatekeeper proxy-logging listing_formats s3api tempauth copy slo dlo "
                  "versioned_writes symlink proxy-logging proxy-server")


def _proxy_conf(port: int, swift_dir: Path) -> str:
    return f"""[DEFAULT]
bind_ip = 127.0.0.1
bind_port = {port}
workers = 0
swift_dir = {swift_dir}
log_level = WARNING
log_address = /nonexistent

[pipeline:main]
pipeline = {PROXY_PIPELINE}

[app:proxy-server]
use = egg:swift#proxy
account_autocreate = true
allow_account_management = true

[filter:s3api]
use = egg:swift#s3api
location = {REGION}
s3_acl = false
check_bucket_owner = false
allow_multipart_uploads = true

[filter:tempauth]
use = egg:swift#tempauth
user_test_tester = {SECRET_KEY} .admin

[filter:catch_errors]
use = egg:swift#catch_errors
[filter:gatekeeper]
use = egg:swift#gatekeeper
[filter:proxy-logging]
use = egg:swift#proxy_logging
[filter:cache]
use = egg:swift#memcache
memcache_servers = 127.0.0.1:1
[filter:listing_formats]
use = egg:swift#listing_formats
[filter:copy]
use = egg:swift#copy
[filter:slo]
use = egg:swift#slo
[filter:dlo]
use = egg:swift#dlo
[filter:versioned_writes]
use = egg:swift#versioned_writes
[filter:symlink]
use = egg:swift#symlink
"""


class SwiftS3:
    """A throwaway Swift with the S3 API on a free loopback port. `endpoint` is the S3 endpoint URL;
    `kill()`/`start()` stop and restart every server process over the same data, as a crash and recovery."""

    def __init__(self) -> None:
        if not available():
            raise RuntimeError(f"no Swift in {SWIFT_VENV}: `make s3` installs it")
        # in memory where it can be (tmpfs keeps xattrs, and its fsync costs nothing: a test's PUT takes a few
        # ms, not the half second a loaded disk gives); RUNLEDGER_SWIFT_DIR names another parent
        parent = os.environ.get("RUNLEDGER_SWIFT_DIR") or ("/dev/shm" if _xattrs("/dev/shm") else None)
        self.dir = Path(tempfile.mkdtemp(prefix="runledger-swift-", dir=parent))
        self.etc = self.dir / "etc"
        self.devices = self.dir / "srv"
        (self.devices / "d1").mkdir(parents=True)
        self.etc.mkdir()
        self.port = free_port()
        self.ports = {kind: free_port() for kind in SERVERS}
        (self.etc / "swift.conf").write_text(
            "[swift-hash]\nswift_hash_path_suffix = runledger-tests\nswift_hash_path_prefix = runledger\n\n"
            "[storage-policy:0]\nname = one\ndefault = yes\n")
        for kind in SERVERS:
            (self.etc / f"{kind}-server.conf").write_text(_server_conf(kind, self.ports[kind], self.devices, self.etc))
            builder = str(self.etc / f"{kind}.builder")
            ring = SWIFT_VENV / "bin" / "swift-ring-builder"
            for args in (["create", "0", "1", "1"], ["add", f"r1z1-127.0.0.1:{self.ports[kind]}/d1", "1"], ["rebalance"]):
                done = subprocess.run([str(ring), builder, *args], capture_output=True, text=True, env=self._env())
                if done.returncode not in (0, 1):  # (1: rebalance's warnings)
                    raise RuntimeError(f"swift-ring-builder {args}: {done.stdout}{done.stderr}")
        (self.etc / "proxy-server.conf").write_text(_proxy_conf(self.port, self.etc))
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AWS_"))}
        env["SWIFT_CONF_FILE"] = str(self.etc / "swift.conf")
        return env

    def start(self) -> "SwiftS3":
        for kind in (*SERVERS, "proxy"):
            conf = self.etc / f"{kind}-server.conf"
            log = open(self.dir / f"{kind}.log", "ab")
            self.procs[kind] = subprocess.Popen([str(SWIFT_VENV / "bin" / f"swift-{kind}-server"), str(conf), "-v"],
                                                stdout=log, stderr=subprocess.STDOUT, env=self._env(),
                                                start_new_session=True)
            log.close()
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/healthcheck", timeout=2)
            except urllib.error.HTTPError:
                break  # (no healthcheck middleware: any HTTP answer means the proxy is up)
            except OSError:
                dead = [k for k, p in self.procs.items() if p.poll() is not None]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"swift did not start ({dead}): {self.logs()}")
                time.sleep(0.2)
                continue
            break
        return self

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.dir.glob("*.log")))

    def kill(self) -> None:
        """Every Swift process killed at once (SIGKILL), as the object server's machine crashing."""
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self.procs.clear()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def client(self):
        """A boto3-free S3 client: pyarrow's S3 file system on this server."""
        from pyarrow import fs

        return fs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, endpoint_override=self.endpoint,
                               scheme="http", region=REGION, allow_bucket_creation=True)

    def credentials(self) -> dict[str, str]:
        """The AWS_* variables that point a process at this server."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION,
                "AWS_ENDPOINT_URL": self.endpoint}

    def bucket(self, name: str) -> str:
        self.client().create_dir(name)
        return name


@pytest.fixture(scope="module")
def swift():
    """A Swift S3 server for a test module (imported by the modules that use it)."""
    server = SwiftS3().start()
    yield server
    server.stop()
