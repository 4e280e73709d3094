"""Leases: which instance writes which partition, held in the JetStream KV bucket `runledger-leases-k{K}`.

`create` takes a free lease (key `p{p}`, the holder in the value), `update(..., last=revision)` renews
it every RENEW_EVERY_S, and a lease its holder stops renewing expires after LEASE_TTL_S, for a standby's
`create` to take. A writer commits only while its last renewal is less than LEASE_TTL_S - FENCE_MARGIN_S
old (`Leases.holds`). Balancing: instances announce themselves (keys `i.*`), and one holding more than
ceil(K / instances) hands the extra partitions over.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
import threading
import time

from runledger.ledger.contract.events import STREAM
from runledger.ledger.ingest.partitions.parts import lease_bucket

log = logging.getLogger(__name__)

LEASE_TTL_S = 3.0  # a lease not renewed for this long expires: the longest a dead writer holds its partition
RENEW_EVERY_S = 0.5  # how often a holder renews (several renewals fit in a TTL, so one lost renewal costs nothing)
FENCE_MARGIN_S = 1.0  # a writer stops committing this long before its lease could have expired
POLL_S = 0.25  # how often the lease thread looks at the leases (a free one is taken within this)
STAGGER_S = 0.5  # an instance at its fair share waits this (times its partitions + 1) before taking a free one
BALANCE_EVERY_S = 2.0  # how often an instance counts the live instances, and hands over a partition past its share


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
