"""The audit from public files alone (`runledger tlog audit`): given a log's tiles and checkpoint (a
folder or a URL), its verifier key, and the published tables (a root, or `runledger export`'s output),
check the checkpoint's signature; its consistency with the checkpoint this user audited before for that
log (kept in the user's state folder, $XDG_STATE_HOME/runledger/tlog/, as the go command keeps the
checksum database's tree heads); rebuild the tree from the entry bundles and the tiles; match leaves
and events both ways (the leaves of a deleted run excepted, by name); and recompute every event hash
and chain link (runledger.ledger.check). With a C2SP tlog-policy, the checkpoint must also carry the
policy's quorum of valid witness cosignatures (runledger.ledger.tlog.cosignature). With a time-stamping
authority's certificates, every RFC 3161 token the log holds (`timestamp/<size>.tsr`: each one of a local
folder, the audited checkpoint's over HTTP) must check over the checkpoint of its size, recomputed from the
tiles (runledger.ledger.tlog.timestamps); a missing one is said, and fails only when timestamps are
required. An event whose own `time` is later than the genTime of the earliest stamped checkpoint holding
it (beyond the token's accuracy and MAX_CLOCK_SKEW_S) claims a time the token shows untrue: named. Every chain's signed heads are checked as `runledger verify` checks them (the same function); a
chain without heads is counted as unsigned, and fails only when signed chains are required; so is every
stored attestation of a model checkpoint (runledger.ledger.check.attested). The first difference is named."""

from __future__ import annotations

import bisect
import concurrent.futures
import datetime
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from runledger.ledger.tlog import checkpoint, cosignature, merkle, note, policy, tiles, timestamps
from runledger.ledger.tlog.log import key_of

Key = tuple[str, str, int, int]  # (run_id, producer, attempt, seq)
# an event's `time` is its producer's clock, a token's genTime the authority's: allowed apart by Kerberos's
# default clock skew (MIT krb5's `clockskew`, 300 s), on top of the token's own stated accuracy
MAX_CLOCK_SKEW_S = 300.0


class AuditFailed(Exception):
    """The first difference the audit found; one line."""


@dataclass
class Audited:
    logs: list[checkpoint.Checkpoint] = field(default_factory=list)
    events: int = 0
    deleted_runs: list[str] = field(default_factory=list)  # runs whose leaves have no events: tombstoned
    cosigned: dict[str, list[str]] = field(default_factory=dict)  # origin -> the policy's witnesses that cosigned
    stamped: dict[str, str] = field(default_factory=dict)  # origin -> what its timestamps showed, said
    tokens: dict[str, dict[int, timestamps.Stamp]] = field(default_factory=dict)  # origin -> size -> its checked token
    signed: str | None = None  # the chains' signed heads and the attestations, said (runledger.ledger.check)

    def text(self) -> str:
        lines = [f"log {cp.origin}: size {cp.size}, root {cp.text().split(chr(10))[2]}"
                 + (f", cosigned by {', '.join(self.cosigned[cp.origin]) or 'no witness'}"
                    if cp.origin in self.cosigned else "")
                 + (f", {self.stamped[cp.origin]}" if cp.origin in self.stamped else "") for cp in self.logs]
        lines.append(f"ok: {self.events} events, each a leaf of a signed checkpoint and each leaf an event"
                     + (f"; leaves of deleted runs: {', '.join(self.deleted_runs)}" if self.deleted_runs else ""))
        if self.signed:
            lines.append(self.signed)
        return "\n".join(lines)


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "runledger" / "tlog"


def _seen_file(origin: str, folder: Path) -> Path:
    return folder / (hashlib.sha256(origin.encode()).hexdigest()[:32] + ".checkpoint")


def logs_in(where: str) -> list[str]:
    """A log's folder or URL (http(s)://, or s3:// beside the tables); a local `tlog/` of a partitioned
    ledger: each partition's."""
    if where.startswith(("http://", "https://", "s3://")) or (Path(where) / tiles.CHECKPOINT).exists():
        return [where]
    parts = sorted((p for p in Path(where).glob("p*") if (p / tiles.CHECKPOINT).exists()),
                   key=lambda p: int(p.name[1:]) if p.name[1:].isdigit() else -1)
    if not parts:
        raise AuditFailed(f"{where}: no checkpoint (not a log's folder)")
    return [str(p) for p in parts]


def audit_log(where: str, verifiers: list[note.Verifier], seen: Path, pol: policy.Policy | None = None,
              result: Audited | None = None, stamps: Stamps | None = None) -> tuple[checkpoint.Checkpoint, list[bytes]]:
    """Check one log: the signed checkpoint (with `pol`, its quorum of cosignatures), consistency with the
    one audited before, the tree rebuilt from the entries and read from the tiles, (with `stamps`) its
    timestamps. Returns the checkpoint and its entries; records it as seen."""
    reader = tiles.Tiles(where)
    try:
        signed = reader.checkpoint()
        cp = checkpoint.open_signed(signed, verifiers)
    except (note.NoteError, tiles.TileMissing) as err:
        raise AuditFailed(f"{where}: the checkpoint does not check: {err}") from None
    if pol is not None:
        names = check_quorum(signed, cp, pol)
        if result is not None:
            result.cosigned[cp.origin] = names
    entries: list[bytes] = []
    try:
        for bundle in reader.bundles(cp.size):
            entries += bundle
    except (tiles.TileMissing, ValueError) as err:
        raise AuditFailed(f"{where}: the entries of the checkpoint's {cp.size} leaves cannot be read: {err}") from None
    sha = hashlib.sha256
    root, levels = merkle.root_and_levels([sha(b"\x00" + e).digest() for e in entries], tiles.TILE_HEIGHT)
    if root != cp.root:
        raise AuditFailed(f"{cp.origin}: the entry bundles do not give the checkpoint's root (size {cp.size})")
    try:
        if merkle.tree_hash(reader.node(cp.size), cp.size) != cp.root:
            raise AuditFailed(f"{cp.origin}: the tiles do not give the checkpoint's root (size {cp.size})")
        check_tiles(reader, cp, levels)
    except tiles.TileMissing as err:
        raise AuditFailed(f"{cp.origin}: a tile of size {cp.size} is missing: {err}") from None
    if stamps is not None:
        said, checked = check_timestamps(where, reader, cp, stamps)
        if result is not None:
            result.stamped[cp.origin], result.tokens[cp.origin] = said, checked
    path = _seen_file(cp.origin, seen)
    if path.exists():
        try:
            before = checkpoint.open_signed(path.read_text(), verifiers, cp.origin)
        except note.NoteError as err:
            raise AuditFailed(f"{path}: the checkpoint audited before does not check ({err})") from None
        if before.size > cp.size:
            raise AuditFailed(f"{cp.origin}: the log was truncated: its checkpoint has size {cp.size}, but this "
                              f"user audited size {before.size} before (root {_b64(before.root)})")
        try:
            if before.size:
                proof = merkle.consistency_proof(reader.node(cp.size), before.size, cp.size) if before.size < cp.size else []
                merkle.verify_consistency(before.size, cp.size, before.root, cp.root, proof)
            if merkle.tree_hash(_node_of(levels), before.size) != before.root:
                raise merkle.ProofError("the first leaves differ")
        except merkle.ProofError as err:
            raise AuditFailed(f"{cp.origin}: the log was rewritten: checkpoint size {cp.size} is not consistent with "
                              f"size {before.size} (root {_b64(before.root)}) this user audited before ({err})") from None
    if not path.exists() or checkpoint.open_signed(path.read_text(), verifiers, cp.origin).size <= cp.size:
        seen.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(signed)
        os.replace(tmp, path)
    return cp, entries


def check_tiles(reader: tiles.Tiles, cp: checkpoint.Checkpoint, levels: dict[int, list[bytes]]) -> None:
    """Every hash tile of `cp`'s size holds the hashes of the tree rebuilt from the entry bundles (`levels`:
    merkle.root_and_levels'), byte for byte: the tiles are what proofs are made from, and a tile clients read
    but the root does not cover (one under a full subtree) is checked too. AuditFailed naming the first
    that differs."""
    for k, hashes in sorted(levels.items()):
        level = k // tiles.TILE_HEIGHT
        for n in range(0, -(-len(hashes) // tiles.TILE_WIDTH)):
            got = reader.tile_bytes(level, n, cp.size, keep=False)
            if got != b"".join(hashes[n * tiles.TILE_WIDTH:(n + 1) * tiles.TILE_WIDTH]):
                path = tiles.tile_path(level, n, tiles.tile_width(level, n, cp.size))
                raise AuditFailed(f"{cp.origin}: tile {path} differs from the tree of the entry bundles (size {cp.size})")


def _node_of(levels: dict[int, list[bytes]]) -> merkle.Node:
    """merkle's `node(level, index)` from the tile levels of a rebuilt tree (as tiles.Tiles.node from files)."""
    def node(level: int, index: int) -> bytes:
        t, r = divmod(level, tiles.TILE_HEIGHT)
        return merkle.root_of(levels[t * tiles.TILE_HEIGHT][index << r:(index + 1) << r])
    return node


def check_quorum(signed: str, cp: checkpoint.Checkpoint, pol: policy.Policy) -> list[str]:
    """The policy's witnesses that validly cosigned `signed`; AuditFailed naming those missing when they
    do not make the quorum."""
    try:
        got = cosignature.cosigners(signed, pol.witness_keys())
    except note.NoteError as err:
        raise AuditFailed(f"{cp.origin}: checkpoint size {cp.size}: {err}") from None
    names = {n for n, w in pol.witnesses.items() if w.key in got}
    if not pol.satisfied(names):
        raise AuditFailed(f"{cp.origin}: checkpoint size {cp.size} lacks the policy's quorum ({pol.quorum}): no "
                          f"valid cosignature from {', '.join(pol.missing(names))}")
    return sorted(names)


@dataclass(frozen=True)
class Stamps:
    """How the audit takes timestamps: the authority whose tokens check (None: found tokens are only
    counted), and whether the audited checkpoint must carry a valid one."""

    authority: timestamps.Authority | None = None
    required: bool = False


def check_timestamps(where: str, reader: tiles.Tiles, cp: checkpoint.Checkpoint,
                     stamps: Stamps) -> tuple[str, dict[int, timestamps.Stamp]]:
    """Check every token of the log at `where` up to `cp` (a folder's every one; over HTTP, `cp`'s) over the
    checkpoint of its size, whose root is read from the tiles; AuditFailed naming the first refused, or
    the missing one when required. Returns what they showed, said in a few words, and the tokens that
    checked by size."""
    local = not reader.remote
    sizes = [s for s in timestamps.sizes_in(Path(where)) if s <= cp.size] if local else [cp.size]
    found: dict[int, bytes] = {}
    for size in sizes:
        try:
            found[size] = reader.read(timestamps.path_of(size))
        except tiles.TileMissing:
            continue
    if stamps.authority is None:
        if stamps.required:
            raise AuditFailed(f"{cp.origin}: timestamps are required, but no authority's certificates were given")
        return (f"{len(found)} timestamp(s) not checked (no authority's certificates given)" if found else "no timestamp"), {}
    checked: dict[int, timestamps.Stamp] = {}
    node = reader.node(cp.size)
    for size, reply in found.items():
        text = checkpoint.Checkpoint(cp.origin, size, merkle.tree_hash(node, size)).text()
        try:
            checked[size] = stamps.authority.check(reply, text, size)
        except timestamps.TimestampRefused as err:
            raise AuditFailed(f"{cp.origin}: the timestamp of checkpoint size {size} is refused: {err}") from None
    latest = checked.get(cp.size)
    if latest is None:
        before = max(checked, default=None)
        why = f"checkpoint size {cp.size} has no timestamp" + (
            f" (the latest stamped: size {before}, {_when(checked[before])})" if before is not None else "")
        if stamps.required:
            raise AuditFailed(f"{cp.origin}: {why}; timestamps are required")
        return why, checked
    return f"timestamped {_when(latest)} ({len(checked)} timestamp(s) checked)", checked


def check_times(leaves: dict[Key, tuple[str, int, str]], times: dict[Key, str],
                tokens: dict[str, dict[int, timestamps.Stamp]]) -> None:
    """Each event's own `time` (`times`) is no later than the genTime of the earliest checked token of its log
    over a checkpoint holding it (a size above its leaf index), give or take the token's accuracy and
    MAX_CLOCK_SKEW_S; AuditFailed naming the first, in leaf order, that is."""
    sizes = {origin: sorted(by_size) for origin, by_size in tokens.items()}
    for key, (_, i, origin) in sorted(leaves.items(), key=lambda kv: (kv[1][2], kv[1][1])):
        covering = sizes.get(origin, [])
        j = bisect.bisect_right(covering, i)
        if j == len(covering) or key not in times:
            continue  # (stored after the latest stamped checkpoint: no token dates it)
        stamp = tokens[origin][covering[j]]
        try:
            said = datetime.datetime.fromisoformat(times[key])
        except (TypeError, ValueError):
            raise AuditFailed(f"event {_name(key)}: its time {times[key]!r} is not RFC 3339") from None
        allowed = MAX_CLOCK_SKEW_S + stamp.accuracy_s
        if said > stamp.gen_time + datetime.timedelta(seconds=allowed):
            raise AuditFailed(f"{origin}: event {_name(key)} says it happened at {times[key]}, but checkpoint size "
                              f"{stamp.size} holding it was timestamped {_when(stamp)} ({allowed:g} s allowed for the "
                              f"clocks): its time is not true")


def _when(stamp: timestamps.Stamp) -> str:
    return f"{stamp.gen_time.strftime('%Y-%m-%dT%H:%M:%SZ')} by {stamp.authority}"


def _b64(h: bytes) -> str:
    import base64

    return base64.b64encode(h).decode()


KEY_COLUMNS = ("run_id", "producer", "attempt", "seq")


def read_table(events: Path):
    """The events of a root or an export (a pyarrow Table of the key, hash, kind and time columns; None
    for an export of no events)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from runledger.ledger.storage import export, paths

    cols = [*KEY_COLUMNS, "hash", "kind", "time"]
    if export.is_export(events):
        files = sorted(events.glob("events/kind=*/run_id=*/*.parquet"))
        return pa.concat_tables([pq.read_table(f, columns=cols) for f in files]) if files else None
    paths.check_root(events)
    from runledger.ledger.storage.reads import read_events

    return read_events(events, columns=cols)


def deleted_runs(table) -> set[str]:
    """The runs a stored tombstone deleted."""
    import pyarrow.compute as pc

    from runledger.ledger.storage import removal

    if table is None:
        return set()
    return set(pc.unique(table.filter(pc.equal(table["kind"], removal.TOMBSTONE))["run_id"]).to_pylist())


def read_published(table) -> tuple[dict[Key, str], dict[Key, str]]:
    """The events of `table` (read_table's) as {key: hash} and {key: time}."""
    out: dict[Key, str] = {}
    times: dict[Key, str] = {}
    if table is None:
        return out, times
    cols = [*KEY_COLUMNS, "hash", "time"]
    c = {n: table.column(n).to_pylist() for n in cols}
    for r, p, a, s, h, t in zip(*(c[n] for n in cols)):
        out[(r, p, a, s)] = h
        times[(r, p, a, s)] = t
    return out, times


def entries_of_rows(table):
    """Each row's leaf entry (log.entry_of's RFC 8785 text) built by pyarrow a column at a time (a binary
    Array), or None where that could differ from entry_of's: a null, or a string RFC 8785 would escape (a
    control character, a quote, a backslash; non-ASCII is written as it is by both)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for c in (*KEY_COLUMNS, "hash"):
        col = table[c]
        if col.null_count or (pa.types.is_string(col.type) and pc.any(pc.match_substring_regex(col, r'[\x00-\x1f"\\]')).as_py()):
            return None
    if not all(pa.types.is_integer(table[c].type) for c in ("attempt", "seq")) or \
            not all(pa.types.is_string(table[c].type) for c in ("run_id", "producer", "hash")):
        return None
    text = pc.binary_join_element_wise(
        '{"attempt":', pc.cast(table["attempt"], pa.string()), ',"hash":"', table["hash"], '","producer":"',
        table["producer"], '","run_id":"', table["run_id"], '","seq":', pc.cast(table["seq"], pa.string()), "}", "")
    return pc.cast(text, pa.binary())


def matched(logs: list[list[bytes]], table, deleted: set[str]) -> set[str] | None:
    """The fast match of leaves and events, as sets of entries rather than a dict lookup a leaf: the runs whose
    leaves are excused (deleted by a tombstone) when it is sure that the leaf-by-leaf match (`audit`'s) finds
    no difference, None when it is not (a difference, or rows whose entries it does not build): that match
    then runs and names it. Sure when no two rows share a key, every row's entry (entries_of_rows) is a leaf,
    the leaves are distinct, and each leaf that is no row's entry is of a run a tombstone deleted, of a key
    no row holds and no other such leaf logs. (Python's sets of the entries' bytes: faster here than
    pyarrow's is_in and count_distinct.)"""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows if table is not None else 0
    expected = entries_of_rows(table) if n else None
    if n and (expected is None or table.select(list(KEY_COLUMNS)).group_by(list(KEY_COLUMNS)).aggregate([]).num_rows != n):
        return None
    leaves = [e for entries in logs for e in entries]
    have = set(leaves)
    want = set(expected.to_pylist()) if n else set()
    if len(have) != len(leaves) or not want <= have:
        return None
    extra = have - want
    if not extra:
        return set()
    gone = table.filter(pc.is_in(table["run_id"], value_set=pa.array(sorted(deleted), pa.string()))) if n else None
    stored = set(zip(*(gone[c].to_pylist() for c in KEY_COLUMNS))) if gone is not None else set()
    keys: set[Key] = set()
    try:
        for e in extra:
            key, _ = key_of(e)
            if key[0] not in deleted or key in stored or key in keys:
                return None
            keys.add(key)
    except (ValueError, KeyError, TypeError):
        return None
    return {k[0] for k in keys}


def audit(log: str, verifiers: list[note.Verifier], events: str | Path, seen: Path | None = None,
          check_chains: bool = True, pol: policy.Policy | None = None, stamps: Stamps | None = None,
          require_signed: bool = False, trusted: set[str] | None = None,
          attestations=None) -> Audited:
    """The whole audit (with `pol`, each checkpoint must carry its quorum of cosignatures; with `stamps`,
    its timestamps are checked; `require_signed`, `trusted`: the chain heads, `attestations`: the check of the
    checkpoints' attestations (runledger.ledger.check.attested.Check), as `runledger verify`'s);
    AuditFailed with the first difference."""
    seen = seen or state_dir()
    events = Path(events)
    result = Audited()
    # verify's work (its row checks in processes of their own) runs beside the log's, which is this thread's:
    # its difference is named only when the log has none (leaving the block waits for it either way)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="audit-chains") as pool:
        chains = pool.submit(_check_chains, events, require_signed, trusted, attestations) if check_chains else None
        logs: list[tuple[checkpoint.Checkpoint, list[bytes]]] = []
        for where in logs_in(log):
            cp, entries = audit_log(where, verifiers, seen, pol, result, stamps)
            result.logs.append(cp)
            logs.append((cp, entries))
        table = read_table(events)
        deleted = deleted_runs(table)
        excused = None if any(result.tokens.values()) else matched([e for _, e in logs], table, deleted)
        if excused is None:  # (a difference to name, or the events' times to check against the timestamps)
            excused = match_leaves(logs, table, deleted, events, result)
        result.events, result.deleted_runs = table.num_rows if table is not None else 0, sorted(excused)
        if chains is not None:
            result.signed = chains.result()
    return result


def match_leaves(logs: list[tuple[checkpoint.Checkpoint, list[bytes]]], table, deleted: set[str], events: Path,
                 result: Audited) -> set[str]:
    """Leaves and events matched one by one, both ways, and each event's time against the timestamps;
    AuditFailed naming the first difference; the runs whose leaves are excused (deleted)."""
    leaves: dict[Key, tuple[str, int, str]] = {}  # key -> (hash, index, origin)
    for cp, entries in logs:
        for i, e in enumerate(entries):
            try:
                key, h = key_of(e)
            except (ValueError, KeyError, TypeError):
                raise AuditFailed(f"{cp.origin}: leaf {i} is not an entry of runledger's ({e[:60]!r})") from None
            if key in leaves:
                raise AuditFailed(f"{cp.origin}: leaf {i} logs event {_name(key)} a second time")
            leaves[key] = (h, i, cp.origin)
    published, times = read_published(table)
    excused: set[str] = set()
    for key, (h, i, origin) in leaves.items():
        stored = published.get(key)
        if stored is None:
            if key[0] in deleted:
                excused.add(key[0])
                continue
            raise AuditFailed(f"{origin}: leaf {i} logs event {_name(key)} (hash {h[:16]}…), which {events} does not "
                              f"hold (deleted from the tables?)")
        if stored != h:
            raise AuditFailed(f"{origin}: event {_name(key)} in {events} has hash {stored[:16]}…, but leaf {i} logged "
                              f"{h[:16]}… (the event was rewritten)")
    for key in published:
        if key not in leaves:
            raise AuditFailed(f"event {_name(key)} in {events} is a leaf of no signed checkpoint (added to the tables "
                              f"behind the log, or stored after the last checkpoint)")
    check_times(leaves, times, result.tokens)
    return excused


def _check_chains(events: Path, require_signed: bool = False, trusted: set[str] | None = None,
                  attestations=None) -> str | None:
    """Every event's hash recomputed and every chain link followed, the heads and the attestations checked
    (what `runledger verify` checks); what the heads and attestations showed, said."""
    from runledger.ledger.storage import export

    if export.is_export(events):
        from runledger.ledger.check.exported import verify_export

        report = verify_export(events, require_signed, trusted, attestations)
    else:
        from runledger.ledger.check.verify import verify

        report = verify(events, require_signed=require_signed, trusted=trusted, attestations=attestations)
    if not report.ok:
        raise AuditFailed(f"{events}: {report.problems[0]}")
    said = [report.signed.text()] if report.signed else []
    if report.attested is not None and report.attested.any:
        said.append(report.attested.text())
    return "\n".join(said) or None


def _name(key: Key) -> str:
    return f"{key[0]}/{key[1]}/{key[2]}/{key[3]}"
