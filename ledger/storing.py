"""What a root's spool still holds for its ledger to store, for the commands that read the root.

`finish` on the root's local server returns once the run's events are fsync'd in the spool; the root's
supervisor sends and stores them after (`runledger.ledger.local`). So `runledger sql`, `ui` and
`verify` first `wait_stored(root)`: while the supervisor runs and chains finished less than
RECENT_S ago are still in the spool, they wait for them (up to STORE_WAIT_S, $RUNLEDGER_STORE_WAIT_S);
what is left then is named in one line on stderr (`still_storing_line`), never silently left out.

A chain in the spool is one not known stored: segments or intake files still there (the spool lets
go of them once the ledger said it stored every line), and no producer holds it: killed, or finished
and handed over (`Emitter.hand_over`), or held by the root's supervisor sending it (its lock file names
the holder). A live run's chain streams to the ledger as it goes, and is not waited for.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from runledger.ledger import settings
from runledger.ledger.storage import locks

STORE_WAIT_S = float(os.environ.get("RUNLEDGER_STORE_WAIT_S", 10))
RECENT_S = 60.0  # a chain whose spool changed longer ago than this is not waited for (said only)
POLL_S = 0.1


def unstored_runs(root: str | Path, recent_s: float | None = None) -> dict[str, float]:
    """{run_id: the newest change of its closed chains' spool files} for the runs whose closed chains the
    spool still holds; with `recent_s`, only those changed that recently."""
    found: dict[str, float] = {}
    now = time.time()
    supervisor = _supervisor_pid(root)
    for d in Path(settings.spool_dir(root)).glob("*/*/*"):
        if not d.name.isdigit():
            continue
        files = [*d.glob("seg-*.jsonl"), *d.glob("in-*.jsonl")]
        if not files:
            continue
        try:
            newest = max(f.stat().st_mtime for f in files)
            if locks.is_held(d / "lock") and not (d / settings.HANDED_OVER).exists() and not _sending(d, supervisor):
                continue  # a live producer's
        except OSError:  # removed meanwhile: stored
            continue
        if recent_s is None or now - newest < recent_s:
            run = d.parent.parent.name
            found[run] = max(found.get(run, 0.0), newest)
    return found


def _supervisor_pid(root: str | Path) -> int | None:
    try:
        return json.loads((Path(root).resolve() / "local" / "state.json").read_text())["pid"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _sending(d: Path, supervisor: int | None) -> bool:
    """Whether a held chain is held by the root's supervisor sending what its producer left (the holder the
    lock file names: the supervisor, or a process gone, whose successor has not written its name yet)."""
    try:
        pid = json.loads((d / "lock").read_text() or "{}").get("pid")
    except (OSError, ValueError, AttributeError):
        return False
    if pid == supervisor or type(pid) is not int:
        return pid == supervisor
    try:
        os.kill(pid, 0)
        return False  # a live process of this user: its producer
    except ProcessLookupError:
        return True
    except OSError:  # another user's live process
        return False


def wait_stored(root: str | Path, timeout: float = STORE_WAIT_S) -> list[str]:
    """Wait (up to `timeout`) until the root's supervisor has stored the runs that finished lately; return
    the runs whose events the spool still holds after that (sorted)."""
    if not unstored_runs(root):  # (the common case: nothing to wait for, and nats-py not loaded for it)
        return []
    from runledger.ledger import local

    deadline = time.monotonic() + timeout
    while unstored_runs(root, RECENT_S) and time.monotonic() < deadline:
        if local.running_url(root) is None and not local.starting(root):
            break  # no supervisor to store them: said, not waited for
        time.sleep(POLL_S)
    return sorted(unstored_runs(root))


def still_storing_line(root: str | Path, runs: list[str]) -> str | None:
    """The one line that says which runs' events are not in the tables yet, and where they are."""
    if not runs:
        return None
    from runledger.ledger import local

    named = ", ".join(runs[:5]) + (f" and {len(runs) - 5} more" if len(runs) > 5 else "")
    how = ("the root's ledger is storing them: run this again in a moment" if local.running_url(root) or
           local.starting(root) else f"they are stored at the next `runledger.init` on this root or by "
           f"`runledger sync --root {root}`")
    return (f"runledger: {len(runs)} run{'s' if len(runs) > 1 else ''} ({named}) still being stored: some of their "
            f"events are in the spool ({settings.spool_dir(root)}), not yet in these results; {how}")


def say_still_storing(root: str | Path, timeout: float = STORE_WAIT_S) -> list[str]:
    """`wait_stored`, then the line on stderr if some runs are still being stored; returns them."""
    import sys

    if not Path(settings.spool_dir(root)).is_dir():
        return []
    runs = wait_stored(root, timeout)
    line = still_storing_line(root, runs)
    if line:
        print(line, file=sys.stderr, flush=True)
    return runs
