"""The ledger's side of the transparency log: after each commit of the tables, one leaf per event it
committed, in commit order, written as C2SP tlog-tiles under `{root}/tlog/` (a partition's under
`tlog/p{N}/`, its own origin `{key name}/p{N}`), and a signed checkpoint at most every SIGN_EVERY_S
and at every `run_finished`.

Crash consistency. Tiles and bundles are written (fsynced) before the log's size moves; the size and
the last signed (size, root) are kept apart from the public tiles, in `{root}/tlog-state/`, read and
written under a lock. When the ledger starts (`Log.resume`), the right edge is read from the partial
tiles of the log's size and checked against the last signed root (O(log n) tiles), and the events of
the commits past that size (each commit records its first leaf in the tables' snapshots:
runledger.ledger.storage.leaves) get their leaves: a commit that died before its leaves were written,
or between its tables. Where that cannot tell (the log was off or refused while the ledger stored, a
torn edge, the tables' history gone), the log is rebuilt from its entry bundles (`Log.open`): a
recomputed root that differs from the last signed checkpoint's is refused with one line (TlogRefused);
every stored event without a leaf is appended.
Leaves are only appended after the tables took their events, so no leaf lacks its event, except the
leaves of a deleted run (the tombstone says so; the log keeps what existed).

Signing. Before each signature the tree is checked to extend the last signed one (the stored root of
the last signed size is recomputed from the tiles): the log never signs two inconsistent checkpoints.
Another ledger host taking a partition over reads the same state and extends the same log; with a
shared catalog, the last signed size and root are its compare-and-swap row
(runledger.ledger.storage.signedrows), so hosts with state of their own never fork it either. With the
tables on object storage, the public files are beside them in the bucket (`log_dir`). The key
is a file outside the data root, 0600 ($RUNLEDGER_TLOG_KEY, else $XDG_CONFIG_HOME/runledger/tlog.key,
made on first use and said where).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Callable, Iterable

from runledger.ledger.contract.canonical import canonical_json
from runledger.ledger.storage import locks
from runledger.ledger.storage.files import fsync_dir
from runledger.ledger.tlog import checkpoint, merkle, note, tiles

log = logging.getLogger(__name__)

ENTRY_FIELDS = ("attempt", "hash", "producer", "run_id", "seq")  # the envelope fields a leaf commits to
PUBLIC_DIR = "tlog"  # served to anyone (the dashboard's /tlog/...)
STATE_DIR = "tlog-state"  # the log's size and last signed checkpoint: never served, never a tile
SIGN_EVERY_S = 2.0  # the most often a checkpoint is signed while commits keep coming (run_finished: at once)
KEY_ENV = "RUNLEDGER_TLOG_KEY"
OFF_ENV = "RUNLEDGER_TLOG"  # "off": no log (the bench's baseline)
RUN_FINISHED = "run_finished"
FOLLOWS_KEY = "commits_say_leaves"  # in the state: the tables' commits say each one's first leaf (see resume)


class TlogRefused(RuntimeError):
    """A log that does not match its last signed checkpoint, or a signature that would fork it; one line."""


def enabled() -> bool:
    return os.environ.get(OFF_ENV, "on").lower() not in ("off", "0", "no", "false")


def entry_of(env: dict) -> bytes:
    """The leaf's entry: RFC 8785 canonical JSON of the envelope's attempt, hash, producer, run_id, seq."""
    return canonical_json({k: env[k] for k in ENTRY_FIELDS}).encode()


def key_of(entry: bytes) -> tuple[tuple[str, str, int, int], str]:
    """((run_id, producer, attempt, seq), hash) of an entry."""
    d = json.loads(entry)
    return (d["run_id"], d["producer"], d["attempt"], d["seq"]), d["hash"]


def key_file() -> Path:
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV])
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "runledger" / "tlog.key"


def load_or_make_key(path: Path | None = None, name: str | None = None) -> note.Signer:
    """The log's signer key at `path` (key_file()), made there (0600) on first use, saying where."""
    return note.load_or_make_key(path or key_file(), name, "the transparency log's signing key")


def log_dir(root: Path, part: str | None = None):
    """The log's public folder: `{root}/tlog/` (a partition's `tlog/p{N}/`), or beside the tables on object
    storage, `{warehouse}/tlog/` (an ObjectPath; this process then reads and writes the root's bucket:
    runledger.ledger.storage.objects). Its private state stays in the root (STATE_DIR) either way."""
    from runledger.ledger.storage import objects

    named = objects.configure(Path(root))
    base = objects.ObjectPath(named["warehouse"]) / PUBLIC_DIR if named else Path(root) / PUBLIC_DIR
    return base / part if part else base


def write_file(path, data: bytes, durable: bool = True) -> None:
    """Write `path` whole (a temp file renamed over it); `durable`: fsynced with its folder before return
    (else the caller syncs it later: `_sync`). An object (runledger.ledger.storage.objects.ObjectPath) is
    written whole by one PUT, durable once it returns."""
    if not isinstance(path, Path):
        path.write_bytes(data)
        return
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        fsync_dir(path.parent.parent)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def _sync(paths: set[Path]) -> None:
    """fsync files written without it, then their folders (objects are durable once written)."""
    paths = {p for p in paths if isinstance(p, Path)}
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:  # (a superseded partial, deleted since)
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for d in {p.parent for p in paths}:
        if d.is_dir():
            fsync_dir(d)


class Log:
    """One log (the root's, or a partition's `part` = "p{N}") as its writer holds it: the size and the
    right edge of the tree (each tile level's partial hashes, the partial entry bundle)."""

    def __init__(self, root: str | Path, part: str | None = None, signer: note.Signer | None = None) -> None:
        self.root, self.part = Path(root), part
        self.dir = log_dir(self.root, part)
        self.state_path = self.root / STATE_DIR / f"{part or 'log'}.json"  # origin, last signed: fsynced
        self.size_path = self.root / STATE_DIR / f"{part or 'log'}.size"  # the size: synced when signing
        self._dirty: set[Path] = set()  # written since the last signature, not yet fsynced
        self.lock_path = self.root / STATE_DIR / f"{part or 'log'}.lock"
        self.signer = signer
        self.origin = self._origin()
        self.size = 0
        self.levels: list[list[bytes]] = []  # level t: the hashes of its partial tile
        self.bundle: list[bytes] = []  # the partial entry bundle
        self._partials_at = -1  # the size whose partial tiles are written
        self._last_sign = 0.0
        self._signed_size = -1
        self.shared = None  # runledger.ledger.storage.signedrows.SignedRows: the last signed, in a shared catalog
        self.witnessing = None  # runledger.ledger.tlog.witnessing.Witnessing: asked after each signature
        self.timestamping = None  # runledger.ledger.tlog.timestamping.Timestamping: asked after each signature

    def _origin(self) -> str | None:
        if self.signer is None:
            return None
        return self.signer.name + (f"/{self.part}" if self.part else "")

    def _local_state(self) -> dict:
        try:
            return json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return {}

    def _state(self) -> dict:
        state = self._local_state()
        try:
            state["size"] = int(self.size_path.read_text())
        except (FileNotFoundError, ValueError):  # (lost with a power cut: the bundles and tables say again)
            state["size"] = (state.get("signed") or {}).get("size", 0)
        if self.shared is not None and self.origin:  # (the hosts of one log: the catalog's row says, not ours)
            state["signed"] = self.shared.get(self.origin)
            state["size"] = state["signed"]["size"] if state["signed"] else 0
        return state

    def _save_state(self, **fields) -> None:
        state = {k: v for k, v in {**self._local_state(), **fields}.items() if k != "size"}
        write_file(self.state_path, json.dumps(state, sort_keys=True).encode())

    def _save_size(self) -> None:
        write_file(self.size_path, str(self.size).encode(), durable=False)
        self._dirty.add(self.size_path)

    # -- opening: rebuild, check against the last signature, catch up with the tables --

    @property
    def name(self) -> str:
        """The log's name in the tables' commits (runledger.ledger.storage.leaves) and its state files."""
        return self.part or "log"

    def _opened_state(self) -> dict:
        """The log's state, its origin checked against the key's (TlogRefused) and recorded if new."""
        with locks.hold(self.lock_path, f"transparency log {self.dir}", wait_s=30):
            state = self._state()
        if state.get("origin") and self.origin and state["origin"] != self.origin:
            raise TlogRefused(f"{self.dir}: the log's origin is {state['origin']!r}, but the key given signs as "
                              f"{self.origin!r}: give this ledger the log's key")
        if self.origin and not state.get("origin"):
            self._save_state(origin=self.origin)
        return state

    def follow_commits(self, on: bool) -> None:
        """Record whether the tables' commits say every event's first leaf (runledger.ledger.storage.leaves)
        since the log last held every stored event: on after a catch-up from all of them, off (before
        its next commit) when a ledger stores without this log. Only `resume` reads it."""
        with locks.hold(self.lock_path, f"transparency log {self.dir}", wait_s=30):
            if bool(self._state().get(FOLLOWS_KEY)) != on:
                self._save_state(**{FOLLOWS_KEY: on})

    # -- opening: from the right edge and the commits since (resume), or rebuilt from every entry (open) --

    def resume(self, since: Callable[[int], list[tuple[tuple[str, str, int, int], str]]]) -> int | None:
        """Open the log from its right edge (O(log n) tiles) and append the leaves of the events the
        tables took since its durable size, `since(size)` (the commits after it:
        runledger.ledger.storage.leaves.since, raising LookupError when it cannot say), then sign.
        Returns how many leaves were appended, or None when only `open` can tell (the commits did not
        follow the log: it was off or refused meanwhile; a tile of the edge missing or torn; its root
        not the last signed one; the tables' history gone): nothing was changed then."""
        state = self._opened_state()
        signed, size = state.get("signed"), int(state.get("size", 0))
        if not state.get(FOLLOWS_KEY) or (size < signed["size"] if signed else size > 0):
            return None
        try:
            levels, bundle = self._edge(size)
            if signed and self._root_at(size, signed["size"]).hex() != signed["root"]:
                raise ValueError(f"its tiles do not give the root of its last signed checkpoint (size {signed['size']})")
            missing = since(size)
        except (tiles.TileMissing, ValueError, KeyError, TypeError, LookupError) as err:
            log.warning("%s: %s; rebuilding the log from every entry and stored event", self.dir, err)
            return None
        self.size, self.levels, self.bundle, self._partials_at = size, levels, bundle, size
        self._signed_size = signed["size"] if signed else -1
        self._append_stored(missing)
        self.sign()
        return len(missing)

    def _root_at(self, size: int, at: int) -> bytes:
        """The root of the first `at` leaves, from the tiles of a tree of `size` (O(log n) of them)."""
        return merkle.tree_hash(tiles.Tiles(self.dir).node(size), at) if at else merkle.root_of([])

    def _edge(self, size: int) -> tuple[list[list[bytes]], list[bytes]]:
        """The right edge of a tree of `size` from its partial tiles and bundle (as `_extend` keeps it),
        the bundle's leaves checked against the level-0 tile."""
        reader = tiles.Tiles(self.dir)
        levels, t = [], 0
        while size >> (tiles.TILE_HEIGHT * t):
            n, width = divmod(size >> (tiles.TILE_HEIGHT * t), tiles.TILE_WIDTH)
            levels.append(reader.tile(t, n, size) if width else [])
            t += 1
        bundle = list(reader.entries(size, size - size % tiles.TILE_WIDTH))
        if [merkle.leaf_hash(e) for e in bundle] != (levels[0] if levels else []):
            raise ValueError("its partial entry bundle does not give its partial tile")
        for e in bundle:
            key_of(e)
        return levels, bundle

    def _append_stored(self, stored: list[tuple[tuple[str, str, int, int], str]]) -> None:
        if stored:
            log.warning("%s: %d stored events had no leaf (a commit cut short?); appending them", self.dir, len(stored))
            self.append_entries([canonical_json({"attempt": k[2], "hash": h, "producer": k[1], "run_id": k[0],
                                                 "seq": k[3]}).encode() for k, h in stored])

    def open(self, stored: Iterable[tuple[tuple[str, str, int, int], str]]) -> int:
        """Rebuild the log from its entry bundles, refuse it if it differs from its last signed
        checkpoint, append a leaf for every `stored` (key, hash) that has none (in the order given),
        and sign. Returns how many leaves were appended."""
        state = self._opened_state()
        signed = state.get("signed")
        size = int(state.get("size", 0))
        reader = tiles.Tiles(self.dir)
        entries: list[bytes] = []
        try:
            entries = list(reader.entries(size))
            for e in entries[signed["size"] if signed else 0:]:  # unsigned leaves: whole after a power cut?
                key_of(e)
        except (tiles.TileMissing, ValueError, KeyError, TypeError) as err:
            keep = signed["size"] if signed else 0
            log.error("%s: %s; rebuilding the log from its last signed size %d", self.dir, err, keep)
            try:
                entries = list(reader.entries(keep)) if keep else []
            except (tiles.TileMissing, ValueError) as err2:
                raise TlogRefused(f"{self.dir}: the entries of its last signed checkpoint (size {keep}) cannot be "
                                  f"read ({err2}): not extending it") from None
        hashes = [merkle.leaf_hash(e) for e in entries]
        if signed:
            if len(hashes) < signed["size"] or merkle.root_of(hashes[:signed["size"]]).hex() != signed["root"]:
                raise TlogRefused(f"{self.dir}: the log's entries do not give the root of its last signed checkpoint "
                                  f"(size {signed['size']}): the log was changed; not extending it")
            self._signed_size = signed["size"]
        self._rebuild(entries, hashes)
        stored = list(stored)
        seen = {key_of(e)[0] for e in entries} if stored else set()
        missing = [(k, h) for k, h in stored if k not in seen]
        self._append_stored(missing)
        self.sign()
        return len(missing)

    def _rebuild(self, entries: list[bytes], hashes: list[bytes]) -> None:
        """Set the right edge from all leaves, rewriting every tile and bundle that does not match
        (a torn write before a crash); the tiles are a function of the entries."""
        self.size, self.levels, self.bundle = 0, [], []
        writes = self._extend(entries, hashes, every=True)
        for rel, data in writes.items():
            path = self.dir / rel
            try:
                same = path.read_bytes() == data
            except FileNotFoundError:
                same = False
            if not same:
                write_file(path, data)
        self._partials_at = self.size

    # -- appending --

    def append(self, envs: list[dict]) -> None:
        if envs:
            self.append_entries([entry_of(e) for e in envs])

    def append_entries(self, entries: list[bytes]) -> None:
        """Write the full tiles and bundles of `entries` appended (the partial ones are written when a
        size is signed: only a checkpoint's size needs them). Not fsynced until the next signature: a
        crash before it loses only unsigned leaves, which the next start appends again from the tables.
        On failure (OSError) nothing moved: calling it again writes the same files."""
        levels, bundle, size = [list(x) for x in self.levels], list(self.bundle), self.size
        try:
            writes = self._extend(entries, [merkle.leaf_hash(e) for e in entries])
            for rel, data in writes.items():
                write_file(self.dir / rel, data, durable=False)
                self._dirty.add(self.dir / rel)
        except BaseException:
            self.levels, self.bundle, self.size = levels, bundle, size
            raise

    def _write_partials(self) -> None:
        """The partial tiles and bundle of the current size (what a checkpoint of it needs)."""
        if self._partials_at == self.size:
            return
        for rel, data in self._partials().items():
            write_file(self.dir / rel, data, durable=False)
            self._dirty.add(self.dir / rel)
        self._partials_at = self.size

    def _extend(self, entries: list[bytes], hashes: list[bytes], every: bool = False) -> dict[str, bytes]:
        """Advance the right edge by `entries`; the files that changed (`every`: every file)."""
        writes: dict[str, bytes] = {}
        size = self.size
        for e, h in zip(entries, hashes):
            if len(e) > tiles.MAX_ENTRY:
                raise ValueError(f"a leaf's entry of {len(e)} bytes")
            self.bundle.append(e)
            size += 1
            if len(self.bundle) == tiles.TILE_WIDTH:
                writes[tiles.tile_path("entries", size // tiles.TILE_WIDTH - 1)] = tiles.pack_entries(self.bundle)
                self.bundle = []
            t = 0
            while True:
                if len(self.levels) <= t:
                    self.levels.append([])
                self.levels[t].append(h)
                if len(self.levels[t]) < tiles.TILE_WIDTH:
                    break
                n = (size >> (tiles.TILE_HEIGHT * (t + 1))) - 1
                writes[tiles.tile_path(t, n)] = b"".join(self.levels[t])
                h = merkle.root_of(self.levels[t])
                self.levels[t] = []
                t += 1
        self.size = size
        if every:
            writes.update(self._partials())
        return writes

    def _partials(self) -> dict[str, bytes]:
        writes = {}
        for t, hs in enumerate(self.levels):
            if hs:
                n = (self.size >> (tiles.TILE_HEIGHT * t)) // tiles.TILE_WIDTH
                writes[tiles.tile_path(t, n, len(hs))] = b"".join(hs)
        if self.bundle:
            writes[tiles.tile_path("entries", self.size // tiles.TILE_WIDTH, len(self.bundle))] = \
                tiles.pack_entries(self.bundle)
        return writes

    # -- signing --

    def tree_root(self, size: int | None = None) -> bytes:
        size = self.size if size is None else size
        self._write_partials()
        return merkle.tree_hash(tiles.Tiles(self.dir).node(self.size), size)

    def maybe_sign(self, envs: list[dict]) -> None:
        """Sign after a commit: at once if it held a run_finished, else at most every SIGN_EVERY_S."""
        if any(e.get("kind") == RUN_FINISHED for e in envs) or time.monotonic() - self._last_sign >= SIGN_EVERY_S:
            self.sign()

    def sign(self) -> str | None:
        """Sign a checkpoint of the current size, if it is not signed yet; never one inconsistent with the
        last signed (TlogRefused). Without a key, nothing is signed."""
        if self.signer is None or self._signed_size == self.size:
            return None
        with locks.hold(self.lock_path, f"transparency log {self.dir}", wait_s=30):
            last = self._state().get("signed")
            root = self.tree_root()
            if last:
                if last["size"] > self.size:
                    raise TlogRefused(f"{self.dir}: the last signed checkpoint has size {last['size']}, this log "
                                      f"only {self.size}: another writer extended it (not signing a fork)")
                if self.tree_root(last["size"]).hex() != last["root"]:
                    raise TlogRefused(f"{self.dir}: the log no longer extends its last signed checkpoint (size "
                                      f"{last['size']}): not signing")
            self._save_size()
            _sync(self._dirty)  # the tiles and bundles of the size signed are on disk before the signature
            self._dirty = set()
            cp = checkpoint.Checkpoint(self.origin, self.size, root)
            signed = checkpoint.sign(cp, self.signer)
            new = {"size": self.size, "root": root.hex()}
            if self.shared is not None and not self.shared.swap(self.origin, last, new):
                raise TlogRefused(f"{self.dir}: another ledger host signed a checkpoint of this log since size "
                                  f"{last['size'] if last else 0} (the catalog's row moved): not signing a fork")
            self._save_state(signed=new, origin=self.origin)
            write_file(self.dir / tiles.CHECKPOINT, signed.encode())
        self._signed_size, self._last_sign = self.size, time.monotonic()
        if self.witnessing is not None:
            self.witnessing.submit(signed)
        if self.timestamping is not None:
            self.timestamping.submit(signed)
        return signed

    def attach_cosignatures(self, signed: str, lines: list[str]) -> bool:
        """Append witnesses' cosignature lines to the checkpoint file, if it still holds the checkpoint
        of `signed` (a line by the same key replaced); False if a newer checkpoint was signed since."""
        text = note.signatures(signed)[0]
        added = note.signatures(text + "\n" + "".join(ln + "\n" for ln in lines))[1]
        with locks.hold(self.lock_path, f"transparency log {self.dir}", wait_s=30):
            try:
                now, have = note.signatures((self.dir / tiles.CHECKPOINT).read_text())
            except (FileNotFoundError, note.NoteError):
                return False
            if now != text:
                return False
            keys = {(s.name, s.id) for s in added}
            kept = [s.line for s in have if (s.name, s.id) not in keys]
            write_file(self.dir / tiles.CHECKPOINT,
                        (text + "\n" + "".join(ln + "\n" for ln in kept + [s.line for s in added])).encode())
        return True


def open_for(root: Path, part: str | None, stored: Iterable[tuple[tuple[str, str, int, int], str]] | Callable,
             since: Callable | None = None, shared=None) -> Log | None:
    """The ledger's log of `root` (or partition `part`), opened and caught up with the stored events: from
    its right edge and `since` (Log.resume) when the tables' commits say where it stands, else from
    `stored` (every stored event, or a function reading them: only called then); its last signed
    checkpoint in `shared` (a shared catalog's SignedRows) if given; None when the log is off
    ($RUNLEDGER_TLOG=off)."""
    if not enabled():
        return None
    from runledger.ledger.tlog import timestamping, witnessing

    lg = Log(root, part, load_or_make_key())
    lg.shared = shared
    _check_one_log_per_key(Path(root))
    lg.witnessing = witnessing.from_env(lg.dir, lg.signer.verifier, lg.attach_cosignatures)
    lg.timestamping = timestamping.for_log(lg.dir, write_file)
    if since is None or lg.resume(since) is None:
        lg.open(stored() if callable(stored) else stored)
    if since is not None:  # (the ledger's commits from now on say each one's first leaf)
        lg.follow_commits(True)
    if (lg.dir / tiles.CHECKPOINT).exists():  # (signed before this start: asked again)
        for asked in (lg.witnessing, lg.timestamping):
            if asked is not None:
                asked.submit((lg.dir / tiles.CHECKPOINT).read_text())
    return lg


def _check_one_log_per_key(root: Path) -> None:
    """A key signs one log (its name is the origin): say so loudly when a second root uses it, whose log
    an auditor of the first would take for a fork. The first root to use the key is recorded beside it."""
    from runledger.ledger.storage.positions import root_id

    bound = key_file().with_name(key_file().name + ".root")
    mine = f"{root_id(root)} {root.resolve()}"
    try:
        first = bound.read_text().strip()
    except FileNotFoundError:
        try:
            fd = os.open(bound, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return
        with os.fdopen(fd, "w") as f:
            f.write(mine + "\n")
        return
    if first.split(" ", 1)[0] != mine.split(" ", 1)[0]:
        log.warning("the transparency log's key %s already signs the log of root %s; the log of %s signed with it "
                    "has the same origin, which an auditor of the other takes for a fork: give this root a key of "
                    "its own (runledger tlog keygen --out F, then $%s=F)", key_file(), first.split(" ", 1)[-1],
                    root, KEY_ENV)


def stored_events(root: Path, has=None) -> list[tuple[tuple[str, str, int, int], str]]:
    """Every event the tables hold (of the runs `has` takes), as ((run_id, producer, attempt, seq), hash),
    in the order the stream delivered them."""
    from runledger.ledger.storage.reads import read_events  # (pyarrow: only where the tables are read)

    t = read_events(root, columns=["run_id", "producer", "attempt", "seq", "hash", "stream_seq"])
    t = t.sort_by([("stream_seq", "ascending"), ("run_id", "ascending"), ("producer", "ascending"),
                   ("attempt", "ascending"), ("seq", "ascending")])
    cols = [t.column(n).to_pylist() for n in ("run_id", "producer", "attempt", "seq", "hash")]
    return [((r, p, a, s), h) for r, p, a, s, h in zip(*cols) if has is None or has(r)]


def part_of(position) -> str | None:
    """The log of a ledger's `position`: None for the root's, a partition's key (`tlog/p{N}/`)."""
    return position.key if getattr(position, "partitioned", False) else None


def for_ledger(root: Path, position, tables=None) -> Log | None:
    """The log of a ledger's `position` (the root's, or a partition's: `tlog/p{N}/`), opened and caught
    up with its `tables` (runledger.ledger.storage.tables.Tables: the commits since the log's size,
    else every stored event); None when the log is off (then recorded: see unfollowed)."""
    part = part_of(position)
    if not enabled():
        unfollowed(Path(root), part)
        return None
    from runledger.ledger.storage import leaves, signedrows

    def since(size: int):
        if getattr(tables, "registered_anew", False):
            raise LookupError("the root was moved: its tables' history is registered anew")
        return leaves.since(tables, part or "log", size)

    return open_for(Path(root), part,
                    lambda: stored_events(Path(root), getattr(position, "has", None) if part else None),
                    since if tables is not None else None, signedrows.of_tables(tables))


def unfollowed(root: Path, part: str | None) -> None:
    """A ledger stores without the log of `part` (off, or refused): its commits no longer say their first
    leaf, so its next start catches it up from every stored event (Log.follow_commits). Nothing to do
    where there is no log yet."""
    lg = Log(root, part)
    if lg.state_path.exists():
        lg.follow_commits(False)
