"""Chain heads: the last event the ledger stored of every chain, kept apart from the events, so that
`verify` finds a chain cut short — its tail removed, the whole chain removed, or a run's folder deleted.

A hash chain alone cannot show that its end is missing: a chain cut after seq 90 is a valid chain of
91 events. So for every run the ledger records, per (producer, attempt), the highest seq it has stored
and that event's hash, in `{root}/heads/run_id={run_id}.json`. It rewrites a run's file (atomically:
temp file, fsync, rename, fsync dir) after writing the run's events and before acking them, so every
acked event lies at or below a recorded head. Heads only move forward: a head the ledger finds
missing from the events at start is kept, and `verify` names it.

Where a root keeps its tables on object storage (`runledger.ledger.storage.objects`), its heads are in the
bucket beside them (`{warehouse}/heads/run_id={run_id}.json`, each written whole by one PUT): the roots of
several machines that share the tables (partitions taken over from one to another) share the heads too,
so each machine's writer goes on from the heads its predecessor recorded and `verify` on any root finds
every run's.

What this proves, and what not: someone who edits or deletes event files leaves heads they do not
match. Someone who also rewrites `heads/` consistently (or recomputes every hash) is beyond any file
in the root: the heads `verify` prints are for publishing elsewhere (a run's page, a signed note),
and a copy kept outside the root is what holds such a writer to account.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from runledger.ledger.storage import objects

HEADS_DIR = "heads"
PUTS_AT_ONCE = 16  # a bucket's heads files written side by side (pyarrow's S3 client takes concurrent requests)

Chain = tuple[str, int]  # (producer, attempt) within a run
Head = tuple[int, str]  # (seq, hash) of the highest seq stored


def folder(root: Path) -> "Path | objects.ObjectPath":
    """Where the root's heads are: beside its tables (`heads/` in the bucket of a warehouse on object
    storage, else under the root)."""
    named = objects.configure(Path(root))
    return objects.ObjectPath(named["warehouse"]) / HEADS_DIR if named else Path(root) / HEADS_DIR


def run_file(root: Path, run_id: str) -> "Path | objects.ObjectPath":
    return folder(root) / f"run_id={run_id}.json"


def files(root: Path) -> list:
    """The root's heads files, sorted."""
    where = folder(root)
    if isinstance(where, objects.ObjectPath):
        return [f for f in where.files(".json") if f.name.startswith("run_id=")]
    return sorted(where.glob("run_id=*.json"))


def recorded(root: Path) -> bool:
    """Whether this root records heads at all (a root written before heads were recorded does not; a
    warehouse on object storage came after them, so its roots always do)."""
    where = folder(root)
    return isinstance(where, objects.ObjectPath) or where.is_dir()


def carry_up(root: Path) -> int:
    """A root on a bucket whose heads were written under the root (before they moved beside the tables):
    each run's file the bucket lacks is put there, and the local folder goes (the bucket's copy of a run
    another machine recorded since is the newer one). Returns the files put."""
    where, local = folder(root), Path(root) / HEADS_DIR
    if not isinstance(where, objects.ObjectPath) or not local.is_dir():
        return 0
    have = {p.name for p in files(root)}
    put = 0
    for path in sorted(local.glob("run_id=*.json")):
        if path.name not in have:
            (where / path.name).write_bytes(path.read_bytes())
            put += 1
        path.unlink()
    for left in local.iterdir():  # (a temp file a crash left)
        left.unlink()
    local.rmdir()
    return put


def read_run(path: Path) -> dict[Chain, Head]:
    """One run's recorded heads. Raises ValueError if the file is not what the ledger writes."""
    doc = json.loads(path.read_text())
    out: dict[Chain, Head] = {}
    for c in doc["chains"]:
        producer, attempt, seq, hash_ = c["producer"], c["attempt"], c["seq"], c["hash"]
        if not (isinstance(producer, str) and type(attempt) is int and type(seq) is int and isinstance(hash_, str)):
            raise ValueError(f"a chain entry of the wrong shape: {c!r}"[:200])
        out[(producer, attempt)] = (seq, hash_)
    return out


def read_all(root: Path) -> tuple[dict[str, dict[Chain, Head]], list[str]]:
    """Every run's recorded heads, and a line for each heads file that cannot be read."""
    runs: dict[str, dict[Chain, Head]] = {}
    problems: list[str] = []
    for path in files(root):
        try:
            runs[path.name.removesuffix(".json").removeprefix("run_id=")] = read_run(path)
        except (OSError, ValueError, KeyError, TypeError) as err:
            problems.append(f"{path}: the chain heads cannot be read ({type(err).__name__}: {str(err)[:120]})")
    return runs, problems


def advance(heads: dict[str, dict[Chain, Head]], envs: Iterable[dict]) -> set[str]:
    """Move `heads` forward past `envs` (stored events); return the runs whose heads moved."""
    moved: set[str] = set()
    for env in envs:
        run = heads.setdefault(env["run_id"], {})
        chain = (env["producer"], env["attempt"])
        head = run.get(chain)
        if head is None or env["seq"] > head[0]:
            run[chain] = (env["seq"], env["hash"])
            moved.add(env["run_id"])
    return moved


def write(root: Path, heads: dict[str, dict[Chain, Head]], runs: Iterable[str]) -> None:
    """Durably rewrite the heads files of `runs`."""
    where = folder(root)
    runs = sorted(runs)
    if isinstance(where, objects.ObjectPath):  # (one PUT each: an object is replaced whole, never seen half)
        def put(run_id: str) -> None:
            (where / f"run_id={run_id}.json").write_text(json.dumps({"run_id": run_id, "chains": _chains(heads, run_id)}))

        if len(runs) > 1:  # (side by side: a commit's runs wait for one PUT's time, not one each)
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(PUTS_AT_ONCE, len(runs))) as pool:
                list(pool.map(put, runs))
        elif runs:
            put(runs[0])
        return
    where.mkdir(parents=True, exist_ok=True)
    for run_id in runs:
        path = where / f"run_id={run_id}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "w") as f:
            json.dump({"run_id": run_id, "chains": _chains(heads, run_id)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    if runs:
        fd = os.open(where, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _chains(heads: dict[str, dict[Chain, Head]], run_id: str) -> list[dict]:
    return [{"producer": p, "attempt": a, "seq": s, "hash": h} for (p, a), (s, h) in sorted(heads[run_id].items())]


def record(root: Path, envs: list[dict]) -> None:
    """Advance the recorded heads of `root` past `envs`, just written (for writers other than the
    ledger service, which keeps its heads in memory: `store.write_events`)."""
    runs = {e["run_id"] for e in envs}
    heads = {}
    for run_id in runs:
        try:  # (no look first: in a bucket each look is a request)
            heads[run_id] = read_run(run_file(root, run_id))
        except FileNotFoundError:
            heads[run_id] = {}
    write(root, heads, advance(heads, envs))
