"""Partitioned ingest: K ledger partitions by run, each with one writer at a time, held by a lease in JetStream KV.

`runledger ledger serve --partitions K` runs one instance; several instances (on one machine or on
several sharing the root) share the K partitions, and a standby takes a partition over when its
writer dies.

How events are partitioned. The stream RUNLEDGER stays as it is: the record, whose subjects
(`runledger.RUN.KIND`) the agents, notify and the UI filter on. A derived stream `RUNLEDGER_P{K}`
sources it through NATS's deterministic subject mapping `partition(K, 1)` on the run token, storing
each message as `runledger-p{K}.{partition}.{run}.{kind}`; partition p's durable consumer
`ledger-p{p}` filters `runledger-p{K}.{p}.>`. (Transforming RUNLEDGER's own subjects would break
every consumer that filters `runledger.*.decision`; K filtered consumers on RUNLEDGER cannot
express a hash of the run.) The derived stream has work-queue retention: a message is deleted
when its partition's writer acks it, so it holds the backlog, not a second copy. Each message keeps
its RUNLEDGER sequence and subject in the `Nats-Stream-Source` header (`origin`): the rows' `stream_seq` is
RUNLEDGER's, as with one ledger. A run's events all go to one partition, so its chains and its
dedupe stay inside that partition.

Who writes a partition. A lease in the KV bucket `runledger-leases-k{K}` (key `p{p}`, the holder
in the value; the bucket's TTL LEASE_TTL_S): `create` takes a free lease, `update(..., last=revision)`
renews it every RENEW_EVERY_S, and a lease its holder stops renewing expires, for a standby's
`create` to take. nats-py 2.16 has no API for a consumer's pinned-client priority group, so the
lease is the mechanism NATS offers here. Leases are renewed by a thread with its own connection
and loop, so a long commit in the writer does not let its lease lapse. A writer fences itself: it
commits only while its last renewal is less than LEASE_TTL_S - FENCE_MARGIN_S old (Ledger.commit
asks `holds`), and stops when it is not. What a lease cannot fence is a writer frozen (SIGSTOP,
swapped out) between that check and the catalog commit for longer than FENCE_MARGIN_S: the
Iceberg catalog has no fencing token.

A new writer starts like a restarted ledger, on its partition only: it deletes the temp and
uncommitted files of its own runs (never another partition's, which may be in flight), loads what
is stored (the tables' current snapshot: everything its predecessor committed), and makes its
consumer deliver at once what its predecessor left unacked. Positions are per partition
(`{root}/partitions/k{K}-p{p}.position`). Status records (`{root}/partitions/k{K}-p{p}.json`: the
writer, since when, its last commit and snapshot, the backlog as of its last fetch, and each
takeover with the time the partition was without a writer) are what `runledger status` and the
UI read.

Known limits: ledger snapshot numbers (`--snapshot N`) are counted by each instance, so with several
writers they do not name one cut across the tables (reading the current snapshots is exact); every
instance of a root must be started with the same K (recorded in `{root}/partitions/layout.json`).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from runledger.ledger.storage import store
from runledger.ledger.storage.positions import read_position
from runledger.ledger.contract.events import STREAM, SUBJECT_PREFIX

log = logging.getLogger(__name__)

LEASE_TTL_S = 3.0  # a lease not renewed for this long expires: the longest a dead writer holds its partition
RENEW_EVERY_S = 0.5  # how often a holder renews (several renewals fit in a TTL, so one lost renewal costs nothing)
FENCE_MARGIN_S = 1.0  # a writer stops committing this long before its lease could have expired
POLL_S = 0.25  # how often the lease thread looks at the leases (a free one is taken within this)
STAGGER_S = 0.5  # an instance at its fair share waits this (times its partitions + 1) before taking a free one
BALANCE_EVERY_S = 2.0  # how often an instance counts the live instances, and hands over a partition past its share
STATUS_DIR = "partitions"
SOURCE_HEADER = "Nats-Stream-Source"


def partition_of(run_id: str, k: int) -> int:
    """The partition of a run: what nats-server's `partition(k, 1)` computes (FNV-1a, 32 bits, of the token)."""
    h = 0x811C9DC5
    for b in run_id.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h % k


def positions(root: str | Path) -> dict[str, int]:
    """Every position recorded under `root`, by name: "" the single ledger's (positions.write_position),
    "k{K}-p{P}" each partition's (Part.write_position), of each K a ledger served the root with."""
    root = Path(root)
    out = {"": read_position(root)} if (root / "ledger.position").exists() else {}
    for f in (root / STATUS_DIR).glob("k*-p*.position"):
        try:
            out[f.name.removesuffix(".position")] = int(f.read_text())
        except (OSError, ValueError):
            pass
    return out


def stored_upto(recorded: dict[str, int], run_id: str) -> int:
    """How far the stream is stored for `run_id`, from `positions`: every event of the run up to this
    stream seq is readable (the single ledger's position, or that of the run's partition, whichever
    is further: each is written after a commit of everything below it, of its runs)."""
    upto = recorded.get("", 0)
    for name, seq in recorded.items():
        if name:
            k, p = (int(x) for x in name.removeprefix("k").split("-p"))
            if partition_of(run_id, k) == p:
                upto = max(upto, seq)
    return upto


def parts_stream(k: int) -> str:
    return f"{STREAM}_P{k}"


def parts_prefix(k: int) -> str:
    return f"{SUBJECT_PREFIX}-p{k}"


def lease_bucket(k: int) -> str:
    return f"runledger-leases-k{k}"


@dataclass(frozen=True)
class Part:
    """Partition `p` of `k`: its consumer, its files under the root, and which runs are its."""

    k: int
    p: int

    @property
    def durable(self) -> str:
        return f"ledger-p{self.p}"

    @property
    def filter(self) -> str:
        return f"{parts_prefix(self.k)}.{self.p}.>"

    @property
    def key(self) -> str:
        return f"p{self.p}"

    def has(self, run_id: str) -> bool:
        return partition_of(run_id, self.k) == self.p

    def position_file(self, root: Path) -> Path:
        return Path(root) / STATUS_DIR / f"k{self.k}-p{self.p}.position"

    def status_file(self, root: Path) -> Path:
        return Path(root) / STATUS_DIR / f"k{self.k}-p{self.p}.json"

    def read_position(self, root: Path) -> int:
        try:
            return int(self.position_file(root).read_text())
        except (OSError, ValueError):
            return 0

    def write_position(self, root: Path, stream_seq: int) -> None:
        """The last RUNLEDGER seq this partition has taken (as positions.write_position, per partition)."""
        path = self.position_file(root)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(str(stream_seq))
        os.replace(tmp, path)

    def read_status(self, root: Path) -> dict:
        try:
            return json.loads(self.status_file(root).read_text())
        except (OSError, ValueError):
            return {}

    def update_status(self, root: Path, **fields) -> dict:
        """Merge `fields` into the partition's status record (written only by its writer)."""
        doc = self.read_status(root) | fields
        path = self.status_file(root)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, path)
        return doc

    def recover(self, root: Path) -> dict[str, int]:
        """recovery.recover for this partition's runs only: their temp files and the files no commit took
        (a dead predecessor's). Other partitions' files may be in flight: they are left alone."""
        root = Path(root)
        temp = [t for t in root.glob("events/*/*/.*.tmp") if self._mine(t.parent)]
        for t in temp:
            t.unlink(missing_ok=True)
        tables = store.tables_of(root)
        orphans = []
        if tables is not None:
            from runledger.ledger.storage import paths

            orphans = [f for f in paths.uncommitted_files(root) if f.parent.name.startswith("run_id=") and self._mine(f.parent)]
            for f in orphans:
                f.unlink(missing_ok=True)
        return {"temp_files_removed": len(temp), "uncommitted_files_removed": len(orphans)}

    def _mine(self, folder: Path) -> bool:
        return folder.name.startswith("run_id=") and self.has(folder.name.removeprefix("run_id="))


def origin(msg) -> tuple[str, bytes, int]:
    """(RUNLEDGER subject, data, RUNLEDGER stream seq) of a message of the partitioned stream, from its
    `Nats-Stream-Source` header ("RUNLEDGER <seq> <transforms> <subject> <id>")."""
    fields = (msg.headers or {}).get(SOURCE_HEADER, "").split(" ")
    if len(fields) >= 4 and fields[0] == STREAM and fields[1].isdigit():
        return fields[-2], msg.data, int(fields[1])
    raise ValueError(f"message {msg.subject} of the partitioned stream has no source header")


# ------------------------------------------------------------------------------------ JetStream


async def ensure_parts_stream(js, k: int, start_seq: int = 0) -> None:
    """The derived stream of `k` partitions (see the module's docstring); made once, sourcing RUNLEDGER
    from `start_seq` + 1 (what a root's single ledger took before is not sourced again)."""
    from nats.js.errors import BadRequestError, NotFoundError

    name = parts_stream(k)
    try:
        await js.stream_info(name)
        return
    except NotFoundError:
        pass
    replicas = (await js.stream_info(STREAM)).config.num_replicas or 1
    try:
        await js.add_stream(parts_stream_config(k, start_seq, replicas))
    except BadRequestError:  # made meanwhile by another instance
        pass


def parts_stream_config(k: int, start_seq: int = 0, replicas: int = 1, sourcing: bool = True):
    """The derived stream's configuration (`sourcing=False`: not fed yet, for a bench's start)."""
    from nats.js.api import RetentionPolicy, StorageType, StreamConfig, StreamSource, SubjectTransform

    prefix = parts_prefix(k)
    source = StreamSource(name=STREAM, opt_start_seq=start_seq + 1 if start_seq else None, subject_transforms=[
        SubjectTransform(src=f"{SUBJECT_PREFIX}.*.>", dest=f"{prefix}.{{{{partition({k},1)}}}}.{{{{wildcard(1)}}}}.>"),
        # a subject of two tokens is no event's: partition 0 quarantines it, as one ledger would
        SubjectTransform(src=f"{SUBJECT_PREFIX}.*", dest=f"{prefix}.0.{{{{wildcard(1)}}}}"),
    ])
    return StreamConfig(name=parts_stream(k), subjects=[], retention=RetentionPolicy.WORK_QUEUE, storage=StorageType.FILE,
                        sources=[source] if sourcing else None, num_replicas=replicas)


def part_consumer_problem(info, part: Part) -> str | None:
    """Why a partition's consumer is not as ensure_part_consumer made it (re-created by someone else to
    deliver only what comes next, say, which on a work-queue stream leaves the rest untaken), or None."""
    cfg = info.config
    deliver, ack = (getattr(v, "value", v) for v in (cfg.deliver_policy, cfg.ack_policy))
    if deliver != "all":
        return f"delivers from {deliver!r}, not from the first message not acked"
    if cfg.filter_subject != part.filter:
        return f"takes {cfg.filter_subject or cfg.filter_subjects}, not partition {part.p}'s {part.filter}"
    if ack != "explicit":
        return f"has ack policy {ack!r}, not explicit"
    return None


async def ensure_part_consumer(js, part: Part) -> None:
    """The partition's durable pull consumer; what a dead writer left unacked is delivered at once (the
    consumer is made anew: on a work-queue stream it starts at the first message not acked)."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
    from nats.js.errors import NotFoundError

    from runledger.ledger.bus.jetstream import ACK_WAIT_S, MAX_ACK_PENDING

    stream = parts_stream(part.k)
    cfg = ConsumerConfig(durable_name=part.durable, deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.EXPLICIT,
                         ack_wait=ACK_WAIT_S, max_deliver=-1, max_ack_pending=MAX_ACK_PENDING, filter_subject=part.filter)
    try:
        info = await js.consumer_info(stream, part.durable)
        if not info.num_ack_pending:
            return
        log.info("partition %d: %d messages left unacked by the last writer; delivering them again now",
                 part.p, info.num_ack_pending)
        await js.delete_consumer(stream, part.durable)
    except NotFoundError:
        pass
    await js.add_consumer(stream, cfg)


async def partition_figures(js, part: Part) -> dict:
    """Live figures from NATS: the partition's backlog (messages not yet acked)."""
    info = await js.consumer_info(parts_stream(part.k), part.durable)
    return {"pending": info.num_pending + info.num_ack_pending, "ack_pending": info.num_ack_pending}


# ------------------------------------------------------------------------------------ leases


def instance_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Leases:
    """This instance's leases on the K partitions, taken and renewed by a thread with its own loop and
    NATS connection. `holds(p)`: the writer of p may commit. `previous(p)`: the lease of p's holder
    before this instance, as last seen (its `renewed` time dates the end of its writing). Instances
    announce themselves (keys `i.*` in the bucket, with the same TTL), and one that holds more than
    ceil(K / instances) hands the extra partitions over: its writers stop, then it lets their leases go."""

    def __init__(self, nats_url: str, k: int, instance: str) -> None:
        self.url, self.k, self.instance = nats_url, k, instance
        self._lock = threading.Lock()
        self._held: dict[int, tuple[int, float]] = {}  # p -> (revision, monotonic time of the last renewal sent)
        self._seen: dict[int, dict] = {}  # p -> the last value seen of another holder's lease
        self._previous: dict[int, dict] = {}  # p -> the holder before us, as last seen
        self._free_since: dict[int, float] = {}
        self._handing_over: set[int] = set()  # partitions past this instance's fair share: their writers stop
        self._release: set[int] = set()  # ... and once stopped, their leases are let go
        self.fair = k  # the most partitions this instance should hold: ceil(K / live instances)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledger-leases", daemon=True)
        self.ready = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> "Leases":
        self._thread.start()
        return self

    def holds(self, p: int) -> bool:
        with self._lock:
            held = self._held.get(p)
        return held is not None and time.monotonic() - held[1] < LEASE_TTL_S - FENCE_MARGIN_S

    def held(self) -> list[int]:
        return [p for p in range(self.k) if self.holds(p)]

    def handing_over(self, p: int) -> bool:
        """Whether p's writer should stop (committing what it has) so that another instance takes p."""
        with self._lock:
            return p in self._handing_over

    def release(self, p: int) -> None:
        """p's writer has stopped: let its lease go now."""
        with self._lock:
            self._release.add(p)

    def previous(self, p: int) -> dict:
        with self._lock:
            return dict(self._previous.get(p, {}))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _value(self) -> bytes:
        return json.dumps({"holder": self.instance, "renewed": time.time()}).encode()

    def _run(self) -> None:
        try:
            asyncio.run(self._loop())
        except BaseException as err:  # the writers see no lease, and stop: said loudly
            self.error = err
            log.exception("the lease thread stopped")
            with self._lock:
                self._held.clear()
        finally:
            self.ready.set()

    async def _loop(self) -> None:
        from nats.js.api import KeyValueConfig, StorageType
        from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

        from runledger.ledger.bus import jetstream as bus

        nc = await bus.connect(self.url, name=f"ledger-leases-{self.instance}")
        js = nc.jetstream()
        try:
            kv = await js.key_value(lease_bucket(self.k))
        except (BucketNotFoundError, NotFoundError):
            replicas = (await js.stream_info(STREAM)).config.num_replicas or 1
            kv = await js.create_key_value(KeyValueConfig(bucket=lease_bucket(self.k), ttl=LEASE_TTL_S, history=1,
                                                          storage=StorageType.FILE, replicas=replicas))
        self.ready.set()
        presence = "i." + "".join(c if c.isalnum() or c in "-_" else "_" for c in self.instance)
        presence_rev, balanced = 0, 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                release, self._release = self._release, set()
            for p in release:
                with self._lock:
                    held = self._held.pop(p, None)
                    self._handing_over.discard(p)
                if held is not None:
                    try:
                        await kv.delete(f"p{p}", last=held[0])
                        log.info("partition %d: handed over by %s (past its share of %d)", p, self.instance, self.fair)
                    except Exception as err:
                        log.debug("partition %d: lease not released (%s)", p, err)
            if now - balanced >= BALANCE_EVERY_S:
                balanced = now
                try:
                    presence_rev = await kv.put(presence, self._value())
                    live = sum(key.startswith("i.") for key in await kv.keys())  # (nats-py 2.16's filters find none)
                    self.fair = -(-self.k // max(1, live))
                    with self._lock:
                        extra = len(self._held) - len(self._handing_over) - self.fair
                        for p in sorted(self._held, reverse=True):
                            if extra <= 0:
                                break
                            if p not in self._handing_over:
                                self._handing_over.add(p)
                                extra -= 1
                except Exception as err:
                    log.debug("instances not counted (%s)", err)
            for p in range(self.k):
                key = f"p{p}"
                with self._lock:
                    held = self._held.get(p)
                try:
                    if held is not None:
                        if now - held[1] >= RENEW_EVERY_S:
                            sent = time.monotonic()
                            rev = await kv.update(key, self._value(), last=held[0])
                            with self._lock:
                                self._held[p] = (rev, sent)
                        continue
                    try:
                        entry = await kv.get(key)
                        if entry.value:
                            self._seen[p] = json.loads(entry.value)
                            self._free_since.pop(p, None)
                            continue
                    except KeyNotFoundError:
                        pass
                    first_free = self._free_since.setdefault(p, now)
                    with self._lock:
                        mine = len(self._held)
                    if mine >= self.fair and now - first_free < (mine + 1) * STAGGER_S:
                        continue  # (an instance under its share takes it first; if none does, this one)
                    sent = time.monotonic()
                    rev = await kv.create(key, self._value())
                    with self._lock:
                        self._held[p] = (rev, sent)
                        self._previous[p] = self._seen.pop(p, {})
                    self._free_since.pop(p, None)
                    log.info("partition %d: lease taken by %s", p, self.instance)
                except KeyWrongLastSequenceError:  # someone else holds it (took it, or renewed theirs)
                    with self._lock:
                        lost = self._held.pop(p, None)
                    if lost is not None:
                        log.error("partition %d: lease lost to another instance; this writer stops", p)
                except Exception as err:  # the server is away: renewals wait; `holds` fences by time
                    log.debug("partition %d: lease request failed (%s)", p, err)
            await asyncio.sleep(POLL_S)
        with self._lock:  # let go at once, so that a standby need not wait for the TTL
            mine, self._held = dict(self._held), {}
        try:
            await kv.delete(presence, last=presence_rev)
        except Exception:
            pass
        for p, (rev, _) in mine.items():
            try:
                await kv.delete(f"p{p}", last=rev)
            except Exception as err:
                log.debug("partition %d: lease not released (%s); it expires in %.0f s", p, err, LEASE_TTL_S)
        await nc.close()


# ------------------------------------------------------------------------------------ the root


class SharedRoot:
    """A shared hold on the root's ledger lock: partitioned instances share the root with each other,
    never with a single ledger (which holds the same file exclusively; see runledger.ledger.storage.locks)."""

    def __init__(self, root: Path, k: int) -> None:
        from runledger.ledger.storage.locks import Busy

        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(root / "ledger.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise Busy(f"ledger root {root} is in use by a single (unpartitioned) ledger") from None
        layout = root / STATUS_DIR / "layout.json"
        layout.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(layout, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "w") as f:
                json.dump({"partitions": k, "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}, f)
        except FileExistsError:
            pass
        recorded = json.loads(layout.read_text() or "{}").get("partitions", k)
        if recorded != k:
            self.release()
            raise Busy(f"ledger root {root} is served in {recorded} partitions, not {k} (stop every instance "
                       f"and remove {layout} to change it)")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def layout(root: Path) -> int | None:
    """The number of partitions the root is served in, or None (a single ledger)."""
    try:
        return int(json.loads((Path(root) / STATUS_DIR / "layout.json").read_text())["partitions"])
    except (OSError, ValueError, KeyError):
        return None


# ------------------------------------------------------------------------------------ serving

CATALOG_TRIES = 30  # a second apart: a catalog server being started, or made by another instance
STATUS_EVERY_S = 1.0  # how often a writer rewrites its partition's status record
TAKEOVERS_KEPT = 20  # takeovers remembered in a status record


async def serve(root: str | Path, nats_url: str, k: int, stop: asyncio.Event | None = None,
                batch: int | None = None, catalog: str | None = None) -> dict[int, int]:
    """One instance of a ledger served in `k` partitions: it writes the partitions whose leases it
    holds and stands by for the others, until `stop` (SIGTERM/SIGINT when None); returns the events
    it stored per partition. Raises locks.Busy if a single ledger serves the root, or it is served in
    another number of partitions; service.StreamLost if a writer found RUNLEDGER or the derived stream
    purged or made anew (every writer stops)."""
    import signal

    from runledger.ledger.bus import jetstream as bus
    from runledger.ledger.ingest import service

    root = Path(root)
    if service.halted(root):
        raise service.StreamLost(f"{service.halted(root)} (recorded in {root / service.HALTED}; this root is not "
                                 f"served again)")
    shared = SharedRoot(root, k)
    lost = None  # a writer's StreamLost: every writer stops, and so does this instance
    try:
        catalog = catalog or catalog_of(root)
        if catalog:
            use_catalog(root, catalog)
        open_tables(root)  # a warm standby: the catalog opened (and pyiceberg imported) before any takeover
        if stop is None:
            stop = asyncio.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        while not stop.is_set():  # the streams first (a cluster may still be electing its leader)
            try:
                nc = await bus.connect(nats_url, name="ledger")
                try:
                    js = nc.jetstream()
                    await bus.ensure_stream(js)
                    await ensure_parts_stream(js, k, start_seq=read_position(root))
                finally:
                    await nc.close()
                break
            except Exception as err:
                log.warning("waiting for NATS at %s (%s)", nats_url, str(err) or type(err).__name__)
                await asyncio.sleep(0.5)
        leases = Leases(nats_url, k, instance_id()).start()
        log.info("ledger instance %s serving %s in %d partitions", leases.instance, root, k)
        writers: dict[int, tuple[asyncio.Task, asyncio.Event]] = {}
        stored: dict[int, int] = {}
        while not stop.is_set():
            if leases.error is not None:
                raise RuntimeError(f"the lease thread stopped: {leases.error}")
            for p in range(k):
                if p not in writers and leases.holds(p) and not leases.handing_over(p):
                    ended = asyncio.Event()
                    writers[p] = (asyncio.create_task(_write(root, nats_url, Part(k, p), leases, ended, batch or service.FETCH_BATCH)), ended)
            for p, (task, ended) in list(writers.items()):
                if not leases.holds(p) or leases.handing_over(p):
                    ended.set()
                if task.done():
                    del writers[p]
                    if leases.handing_over(p):
                        leases.release(p)
                    if not task.cancelled() and isinstance(task.exception(), service.StreamLost):
                        lost = task.exception()
                        stop.set()
                    elif not task.cancelled() and task.exception() is not None:
                        log.error("partition %d: writer failed: %s", p, task.exception())
                    elif not task.cancelled():
                        stored[p] = stored.get(p, 0) + task.result()
            try:
                await asyncio.wait_for(stop.wait(), POLL_S)
            except asyncio.TimeoutError:
                pass
        for _, ended in writers.values():
            ended.set()
        for p, result in zip(writers, await asyncio.gather(*(t for t, _ in writers.values()), return_exceptions=True)):
            if isinstance(result, int):
                stored[p] = stored.get(p, 0) + result
            elif isinstance(result, service.StreamLost):
                lost = result
        leases.stop()
        log.info("ledger instance %s stopped", leases.instance)
        if lost is not None:
            raise lost
        return stored
    finally:
        shared.release()


def catalog_of(root: Path) -> str | None:
    """The shared catalog a root's tables are in (named in the root by `use_catalog`), or None (sqlite)."""
    from runledger.ledger.storage.paths import CATALOG_URI_FILE

    try:
        return (Path(root) / CATALOG_URI_FILE).read_text().strip() or None
    except OSError:
        return None


def use_catalog(root: Path, uri: str) -> None:
    """Write the root's tables to the catalog at `uri` (a SQLAlchemy URI: a shared PostgreSQL, say),
    and name it in the root for its readers (`catalog.uri`, for this user only, 0600: a URI may hold
    a password, though one is better kept out of it: libpq reads ~/.pgpass). The root is named there only
    once the catalog opened and holds this root's tables, or none (a catalog made for this root, while
    the root's own catalog holds none either): anything else is refused (paths.NotALedger, one line)
    with the root as it was, for a catalog named in error would leave its readers reading another
    root's tables, or none."""
    from runledger.ledger.storage import paths
    from runledger.ledger.bus.natsserver import write_private
    from runledger.ledger.storage.tables import Tables

    root = Path(root)
    shown = paths.shown_uri(uri)
    rows = _catalog_rows_when_up(root, uri, shown)
    named = root / paths.CATALOG_URI_FILE
    current = catalog_of(root)
    own = current or (f"sqlite:///{root / paths.CATALOG_FILE}" if (root / paths.CATALOG_FILE).exists() else None)
    if not rows and own is not None and own != uri:
        try:
            held = paths.roots_catalog_rows(root, own)
        except Exception:  # (a catalog that does not open holds nothing this root could lose)
            held = None
        if held:
            raise paths.NotALedger(f"{root}: catalog {shown} holds no tables, and this root's are in "
                                   f"{paths.shown_uri(current) if current else paths.CATALOG_FILE}: a root's "
                                   f"tables are not moved from one catalog to another")
    root.mkdir(parents=True, exist_ok=True)
    try:
        open_tables(root, lambda: Tables(root, uri=uri, mark=False), shown)
    except Exception as err:
        raise paths.NotALedger(f"{root}: catalog {shown} cannot be opened: {str(err).splitlines()[0][:200]}") from None
    if current != uri or named.stat().st_mode & 0o077:  # (a URI may carry a secret anywhere: kept private)
        write_private(named, uri + "\n")
    store.tables_of(root).mark()  # (readers read the tables once their catalog is named)


def _catalog_rows_when_up(root: Path, uri: str, shown: str) -> dict[str, str]:
    """paths.roots_catalog_rows, waiting up to CATALOG_TRIES seconds for a catalog's server that is
    not up yet; paths.NotALedger if it stays down."""
    from runledger.ledger.storage import paths

    for attempt in range(CATALOG_TRIES):
        try:
            return paths.roots_catalog_rows(root, uri)
        except paths.NotALedger:
            raise
        except Exception as err:
            if attempt == CATALOG_TRIES - 1:
                raise paths.NotALedger(f"{root}: catalog {shown} cannot be reached: "
                                       f"{str(err).splitlines()[0][:200]}") from None
            log.warning("catalog %s not ready (%s); trying again", shown, str(err).splitlines()[0][:200])
            time.sleep(1.0)
    return {}


def open_tables(root: Path, make=None, where: str = "") -> None:
    """Open the root's tables (`make()`, else store.tables_of's default), once the catalog is there:
    instances starting together race to create its tables and namespace, and one of them loses."""
    for attempt in range(CATALOG_TRIES):
        try:
            if make is None:
                store.tables_of(root)
            else:
                store.use_tables(root, make())  # (the cache `store.tables_of` reads)
            return
        except Exception as err:
            if attempt == CATALOG_TRIES - 1:
                raise
            log.warning("catalog %s not ready (%s); trying again", where or root, str(err).splitlines()[0][:200])
            time.sleep(1.0)


async def _write(root: Path, nats_url: str, part: Part, leases: Leases, ended: asyncio.Event, batch: int) -> int:
    """Write partition `part` while this instance holds its lease (until `ended`); returns the events stored."""
    from runledger.ledger.bus import jetstream as bus
    from runledger.ledger.ingest import service
    from runledger.ledger.bus.jetstream import Puller
    from runledger.ledger.bus.natsserver import LEDGER_API

    ledger = service.Ledger(root, part=part, fence=lambda: leases.holds(part.p))

    async def subscribe(url, durable, stop, ledger):
        while not stop.is_set():
            nc = None
            try:
                nc = await bus.connect(url, name=f"ledger-p{part.p}")
                js = nc.jetstream()
                await ensure_part_consumer(js, part)

                async def answer(msg) -> None:
                    await _answer_chains(ledger, part, js, msg)

                await nc.subscribe(f"{LEDGER_API}.chains.*.*", cb=answer)
                puller = await Puller(nc, parts_stream(part.k), durable).start()
                _record_takeover(root, part, leases)
                return nc, puller
            except Exception as err:
                log.warning("partition %d: waiting for NATS (%s)", part.p, str(err) or type(err).__name__)
                if nc is not None:
                    await nc.close()
                await asyncio.sleep(0.5)
        return None, None

    def watch(js) -> service.Watch:  # the partition's consumer on the derived stream, and both streams
        return service.Watch(js, ledger, part.durable, consumer_stream=parts_stream(part.k),
                             consumer_problem=lambda info: part_consumer_problem(info, part),
                             streams=(parts_stream(part.k),))

    async def remake(js) -> None:  # (deleted: `subscribe` makes it again, from the first message not acked)
        from nats.js.errors import NotFoundError

        try:
            await js.delete_consumer(parts_stream(part.k), part.durable)
        except NotFoundError:
            pass

    async def report() -> None:
        while True:
            commit = {"last_commit": ledger.last_commit} if ledger.last_commit else {}  # (else the predecessor's)
            waits = sorted(ledger.counters.ack_waits)  # this writer's commits: first batch in to its ack
            if waits:
                commit["ack_wait_ms"] = {"median": round(waits[len(waits) // 2] * 1e3, 1),
                                         "p99": round(waits[int(len(waits) * 0.99)] * 1e3, 1), "commits": len(waits)}
                own = sorted(ledger.counters.commit_s)
                commit["commit_ms"] = {"median": round(own[len(own) // 2] * 1e3, 1),
                                       "p99": round(own[int(len(own) * 0.99)] * 1e3, 1)}
            part.update_status(root, writer=leases.instance, renewed=time.time(), position=ledger.taken_upto,
                               backlog=ledger.backlog, stored=ledger.counters.stored, **commit)
            if ended.is_set():  # (the last figures written once the writer stopped)
                return
            try:
                await asyncio.wait_for(ended.wait(), STATUS_EVERY_S)
            except asyncio.TimeoutError:
                pass

    reporter = asyncio.create_task(report())
    try:
        await service._serve(ledger, nats_url, ended, batch, part.durable, None, subscribe=subscribe, unpack=origin,
                             watch=watch, remake=remake)
    finally:
        ended.set()
        await reporter
    log.info("partition %d: writer stopped (%s)", part.p, ledger.counters.line())
    return ledger.counters.stored


def _record_takeover(root: Path, part: Part, leases: Leases) -> None:
    """The partition has a writer again: record who took it from whom, and how long it was without one
    (from the previous holder's last renewal that this instance saw, to now)."""
    now = time.time()
    prev = leases.previous(part.p)
    doc = part.read_status(root)
    takeovers = doc.get("takeovers", [])
    if prev.get("renewed"):
        gap = round(now - prev["renewed"], 3)
        takeovers = (takeovers + [{"from": prev.get("holder"), "to": leases.instance, "at": now, "gap_s": gap}])[-TAKEOVERS_KEPT:]
        log.info("partition %d: taken over from %s after %.2f s without a writer", part.p, prev.get("holder"), gap)
    part.update_status(root, writer=leases.instance, since=now, renewed=now, takeovers=takeovers)


async def _answer_chains(ledger, part: Part, js, msg) -> None:
    """The ledger's chain status (service._answer_chains) for this partition's runs. The ack floor is
    RUNLEDGER's: every message of this partition up to it is stored; when nothing of the partition is
    pending and its source has caught up, that is RUNLEDGER's last seq as read first."""
    parts = msg.subject.split(".")
    if len(parts) != 4 or not msg.reply or not part.has(parts[2]):
        return
    try:
        last = (await js.stream_info(STREAM)).state.last_seq
        info = await js.consumer_info(parts_stream(part.k), part.durable)
        lag = (await js.stream_info(parts_stream(part.k))).sources[0].lag
    except Exception as err:  # no answer is better than a wrong one
        log.debug("chain status: no stream info (%s)", err)
        return
    idle = not info.num_pending and not info.num_ack_pending and not lag
    floor = max(ledger.taken_upto, last) if idle else ledger.taken_upto
    await msg.respond(json.dumps({"ack_floor": floor, **ledger.chain_status(parts[2], parts[3])}).encode())


# ------------------------------------------------------------------------------------ the operators' view


async def figures(root: str | Path, nats_url: str | None, timeout: float = 5.0) -> dict:
    """Per partition: its writer (the lease holder, live from NATS; else the status record's), its lag
    (messages of the partition not yet stored: the partitioned consumer's pending and unacked, live;
    else as of the writer's last fetch), its stored position (RUNLEDGER seq) and its last commit (time,
    ledger snapshot number), and the takeovers recorded. A root served by a single ledger is one
    partition whose lag is its consumer `ledger`'s. `live` says whether NATS answered."""
    from runledger.ledger.bus import jetstream as bus

    root = Path(root)
    k = layout(root)
    rows = []
    for p in range(k or 1):
        part = Part(k, p) if k else None
        doc = part.read_status(root) if part else {}
        takeovers = doc.get("takeovers", [])
        rows.append({"partition": p, "writer": doc.get("writer"), "renewed": doc.get("renewed"),
                     "position": part.read_position(root) if part else read_position(root),
                     "pending": doc.get("backlog"), "last_commit": doc.get("last_commit"),
                     "takeovers": len(takeovers), "longest_gap_s": max((t["gap_s"] for t in takeovers), default=None)})
    live = False
    if nats_url:
        try:
            if not await bus.listening(nats_url):
                raise ConnectionRefusedError("no server listens there")
            nc = await asyncio.wait_for(bus.connect(nats_url, name="runledger-status", max_reconnect_attempts=0,
                                                    allow_reconnect=False), timeout)
        except Exception as err:
            log.warning("NATS at %s did not answer (%s): figures as last recorded", nats_url, err)
        else:
            try:
                js = nc.jetstream()
                if k:
                    kv = await js.key_value(lease_bucket(k))
                for row in rows:
                    if k:
                        part = Part(k, row["partition"])
                        try:
                            row["writer"] = json.loads((await kv.get(part.key)).value)["holder"]
                        except Exception:  # no lease: no writer now
                            row["writer"] = None
                        info = await js.consumer_info(parts_stream(k), part.durable)
                    else:
                        from runledger.ledger.ingest.service import DURABLE

                        info = await js.consumer_info(STREAM, DURABLE)
                    row["pending"] = info.num_pending + info.num_ack_pending
                live = True
            except Exception as err:
                log.warning("NATS did not give every figure (%s): the rest as last recorded", err)
            finally:
                await nc.close()
    if not k:
        rows[0]["last_commit"] = _last_commit(root)
        rows[0]["writer"] = _lock_holder(root)
    return {"root": str(root), "partitions_total": k or 1, "live": live, "partitions": rows}


def _lock_holder(root: Path) -> str | None:
    """The single ledger of a root, as its lock file names it, if that process is alive on this host (the
    lock is not probed: taking it for a moment could make a ledger starting just then refuse to)."""
    try:
        who = json.loads((Path(root) / "ledger.lock").read_text() or "null") or {}
        if who.get("host") == socket.gethostname():
            os.kill(int(who["pid"]), 0)
        return f"{who['host']}:{who['pid']}"
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _last_commit(root: Path) -> list | None:
    """(time, ledger snapshot number) of the root's last commit, from its tables (a single ledger): the
    time is that of the newest file the current snapshot holds (written just before its commit)."""
    from runledger.ledger.storage import paths

    try:
        cut = paths.cut(root)
    except Exception:
        return None
    files = [f.path for listed in cut.files.values() for f in listed if f.path.exists()]
    if not files:
        return None
    newest = max(f.stat().st_mtime for f in files)
    return [datetime.fromtimestamp(newest, timezone.utc).isoformat(timespec="milliseconds"), cut.commit]
