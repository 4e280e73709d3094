"""Where runledger finds its ledger and its server: the root, the NATS URL, the credentials file and
its cache, each from a flag, else its environment variable, else a default. Resolved here only.

| setting | flag      | environment       | default                                                    |
|---------|-----------|-------------------|------------------------------------------------------------|
| root    | `--root`  | `RUNLEDGER_ROOT`  | this user's data folder: `user_root()`                      |
| creds   | `--creds` | `RUNLEDGER_CREDS` | none (a file holding a URL with user and password)         |
| NATS    | `--nats`  | `RUNLEDGER_NATS`  | the server `runledger nats up` started for the root, else `nats://127.0.0.1:4222` |
| cache   |           | `XDG_CACHE_HOME`  | `~/.cache`; runledger keeps what it can work out again under `runledger/` there |

The default root is one per user, not the working directory (which would split one user's runs into
as many ledgers as folders a script ran in): `$XDG_DATA_HOME/runledger` (`~/.local/share/runledger`)
on Linux, `~/Library/Application Support/runledger` on macOS, `%LOCALAPPDATA%\\runledger` on Windows.

Credentials (flag or environment) win over a URL: they are how a role of a secured server is named.
Only the standard library is imported here, so that any command resolves its settings without
loading the rest.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT_ENV = "RUNLEDGER_ROOT"
NATS_ENV = "RUNLEDGER_NATS"
CREDS_ENV = "RUNLEDGER_CREDS"
WAREHOUSE_ENV = "RUNLEDGER_WAREHOUSE"  # s3://bucket/prefix: the embedded default's tables there (runledger.ledger.local)
AWS_SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")  # a warehouse's: never in a child's
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"  # nats-server's own default port
APP = "runledger"


def data_home() -> Path:
    """This user's data folder, as the platform names it (the folder platformdirs' user_data_dir would
    give, without the dependency): $XDG_DATA_HOME or ~/.local/share on Linux and other Unix,
    ~/Library/Application Support on macOS, %LOCALAPPDATA% on Windows."""
    home = Path(os.path.expanduser("~"))
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or home / "AppData" / "Local")
    if sys.platform == "darwin":
        return home / "Library" / "Application Support"
    xdg = os.environ.get("XDG_DATA_HOME", "")
    return Path(xdg) if os.path.isabs(xdg) else home / ".local" / "share"  # (a relative one is ignored, as the spec says)


def user_root() -> str:
    """The default root: one per user, `runledger` in this user's data folder."""
    return str(data_home() / APP)


def demo_dir() -> Path:
    """Where `runledger demo` makes a fresh root for each demo unless given one (beside the user's root,
    never inside it: a root's folder holds only its own files)."""
    return data_home() / f"{APP}-demos"


def root(flag: str | Path | None = None) -> str:
    """The ledger root: `flag`, else $RUNLEDGER_ROOT, else this user's (`user_root`)."""
    return str(flag) if flag else os.environ.get(ROOT_ENV) or user_root()


def nats_dir(root_dir: str | Path) -> Path:
    """Where a root's local server keeps its state, its URL and its credentials (`runledger nats up`)."""
    return Path(root_dir).resolve() / "nats"


def creds_dir(root_dir: str | Path) -> Path:
    """Where `nats up --secure` writes one credentials file per role."""
    return nats_dir(root_dir) / "creds"


def creds_file(root_dir: str | Path, role: str) -> Path:
    """The credentials file of a role (ledger, agent, reader, worker-RUN)."""
    return creds_dir(root_dir) / f"{role}.creds"


def spool_dir(root_dir: str | Path) -> Path:
    """Where a root's producers keep the events NATS has not acknowledged yet."""
    return Path(root_dir) / "spool"


HANDED_OVER = "handed-over"  # in a spool chain's folder: its run finished and left the rest to the root's supervisor


def cache_dir() -> Path:
    """This user's cache of what runledger can always work out again (`runledger.queries.columns`)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "runledger"


def read_creds(path: str | Path) -> str:
    """The server URL (with user and password) in a credentials file."""
    return Path(path).read_text().strip()


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a process runledger starts: this one's, less the server and credentials
    settings (a child is told its server by the caller; a URL there may hold a password, readable in
    /proc/PID/environ) and the object store's keys (a child reads its root's 0600 s3.credentials:
    runledger.ledger.storage.objects), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in (NATS_ENV, CREDS_ENV, *AWS_SECRETS)}
    env.update(extra)
    return env


def env_nats_url() -> str:
    """$RUNLEDGER_NATS, else nats://127.0.0.1:4222: the URL when no flag or root says otherwise."""
    return os.environ.get(NATS_ENV) or DEFAULT_NATS_URL


def named_nats(flag: str | None = None, creds: str | Path | None = None) -> str | None:
    """The server the flags or the environment name: a credentials file (`creds`, else $RUNLEDGER_CREDS),
    else `flag`, else $RUNLEDGER_NATS; None where none does (then a root's own server is meant)."""
    creds = creds or os.environ.get(CREDS_ENV)
    if creds:
        return read_creds(creds)
    return flag or os.environ.get(NATS_ENV) or None


def nats_url(flag: str | None = None, creds: str | Path | None = None, root_dir: str | Path | None = None) -> str:
    """The server to talk to: a credentials file (`creds`, else $RUNLEDGER_CREDS), else `flag`, else
    $RUNLEDGER_NATS, else the server `nats up` started for the root, else nats://127.0.0.1:4222."""
    named = named_nats(flag, creds)
    if named:
        return named
    url_file = nats_dir(root(root_dir)) / "url"
    if url_file.exists():
        return url_file.read_text().strip()
    return DEFAULT_NATS_URL


# The dashboard's address: `runledger ui` records where it serves a root (DASHBOARD_FILE under the root:
# its URL without any token, its process and host) while it runs, so that `runledger.init` can say where
# to look (`run.url`); else the address the default `runledger ui` serves at.
DASHBOARD_FILE = "dashboard.json"
DASHBOARD_PORT = 8765  # `runledger ui`'s default (no registered service: a free-looking port near the usual dashboards')


def default_dashboard_url() -> str:
    return f"http://127.0.0.1:{DASHBOARD_PORT}/"


def record_dashboard(root_dir: str | Path, url: str) -> Path | None:
    """Record that this process serves the dashboard of `root_dir` at `url` (which must hold no token); None
    where the root cannot be written (a reader's copy, say: then nothing is recorded)."""
    import json
    import socket

    file = Path(root_dir) / DASHBOARD_FILE
    tmp = file.with_name(f".{DASHBOARD_FILE}.{os.getpid()}")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)  # (a dashboard opened before the root's first run)
        tmp.write_text(json.dumps({"url": url, "pid": os.getpid(), "host": socket.gethostname()}))
        os.replace(tmp, file)
    except OSError:
        return None
    return file


def forget_dashboard(root_dir: str | Path) -> None:
    """Take back this process's record (another dashboard's, recorded since, stays)."""
    import json

    file = Path(root_dir) / DASHBOARD_FILE
    try:
        if json.loads(file.read_text()).get("pid") == os.getpid():
            file.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def dashboard_url(root_dir: str | Path) -> str | None:
    """The URL of a dashboard serving `root_dir` now (recorded by it; None if none, or its process is gone)."""
    import json
    import socket

    try:
        facts = json.loads((Path(root_dir) / DASHBOARD_FILE).read_text())
        url, pid, host = str(facts["url"]), int(facts["pid"]), facts.get("host")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
    return url
