"""Chaos run: repeated faults during long event streams, then an account of every event.

    python -m runledger.tools.chaos [--quick] [--events N] [--faults K] [--keep DIR] [--warehouse s3://B/P]

Real processes throughout: a nats-server, `runledger ledger serve`, and producers (`runledger.tools.produce`,
a real Emitter with its spool). One phase per fault, each on its own run: the fault is injected K
times while the producer streams N events —
  ledger-sigkill   SIGKILL of the ledger service, restarted at once
  nats-restart     SIGKILL of nats-server, restarted on the same port and store
  worker-sigkill   SIGKILL of the producer, restarted (it resumes from its spool)
  disk-full        the ledger root (a tmpfs) filled up; the ledger stops acking, says so, goes on
                   when space returns (needs root for the tmpfs; skipped with a note otherwise)
  object-store-restart  every process of the warehouse's object server SIGKILLed, restarted over the same
                   data once the ledger has met the outage (only with `--warehouse` and an object server
                   the caller can restart: `run(object_store=...)`, as the S3 tests do with Swift)
  poison           hostile messages mixed into the stream (`poison_messages`: each once stopped the
                   ledger or was silently changed), every other time with a SIGKILL of the ledger right
                   after, so that a fresh ledger meets them again on redelivery; the ledger must
                   quarantine each and stay up
Then, per fault: events emitted, stored, lost (emitted, not stored) and duplicated (stored twice),
and `runledger verify` over the whole ledger. Exit 0 only if nothing was lost or duplicated.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


from runledger import queries
from runledger.ledger.bus import jetstream as bus
from runledger.ledger import redact, settings
from runledger.ledger.contract.canonical import canonical_json, event_hash
from runledger.ledger.contract.events import make_event_id
from runledger.ledger.bus.natsserver import NatsServer
from runledger.ledger.check.verify import verify

log = logging.getLogger("chaos")
REPO = Path(__file__).resolve().parent.parent


@dataclass
class PhaseResult:
    fault: str
    injected: int
    emitted: int
    stored: int
    distinct: int
    seconds: float
    note: str = ""

    @property
    def lost(self) -> int:
        return self.emitted - self.distinct

    @property
    def duplicated(self) -> int:
        return self.stored - self.distinct


class Rig:
    """The processes under test and the knobs to break them."""

    def __init__(self, base: Path, tmpfs_mb: int, warehouse: str | None = None, object_store=None):
        self.base = base
        self.root = base / "ledger"
        self.root.mkdir(parents=True)
        self.tmpfs = _mount_tmpfs(self.root, tmpfs_mb) if warehouse is None else False
        if warehouse is not None:  # the tables in the bucket (credentials from the AWS_* variables)
            from runledger.ledger.storage import objects

            objects.use_warehouse(self.root, warehouse)
        self.object_store = object_store  # (its kill() and start(): the object-store-restart fault)
        self.nats = NatsServer(base / "nats").start()
        self.ledger: subprocess.Popen | None = None
        self.ledger_log = open(base / "ledger.log", "ab")
        self.start_ledger()

    def start_ledger(self) -> None:
        self.ledger = subprocess.Popen(
            [sys.executable, "-m", "runledger.tools.cli", "ledger", "serve", "--root", str(self.root), "--nats", self.nats.url],
            cwd=REPO, stdout=self.ledger_log, stderr=subprocess.STDOUT, env=settings.child_env())

    def kill_ledger(self) -> None:
        self.ledger.kill()
        self.ledger.wait()

    def restart_nats(self, down_s: float) -> None:
        self.nats.kill()
        time.sleep(down_s)
        self.nats = NatsServer(self.nats.dir, self.nats.port).start()

    def producer(self, run_id: str, count: int, rate: float) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "runledger.tools.produce", "--nats", self.nats.url, "--spool", str(self.base / "spool"),
             "--run-id", run_id, "--producer", "worker-0", "--count", str(count), "--rate", str(rate)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(self.base / f"{run_id}.log", "ab"), env=settings.child_env())

    def fill_disk(self) -> Path:
        filler = self.root / "filler.bin"
        chunk = b"\0" * (1 << 20)
        # unbuffered: a buffered file keeps what a write could not place and fails again on close
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(chunk)
            except OSError:  # ENOSPC: full
                pass
        return filler

    def write_failures(self) -> int:
        return (self.base / "ledger.log").read_text(errors="replace").count("not acking")

    def restart_object_store(self, down_s: float) -> None:
        """The object server killed, kept down until the ledger has failed a write or a commit (the S3
        client's own retries can ride out a short outage unseen) and at least `down_s`, then started."""
        before = self.write_failures()
        self.object_store.kill()
        time.sleep(down_s)
        wait_until = time.monotonic() + 30
        while self.write_failures() == before and time.monotonic() < wait_until:
            time.sleep(0.2)
        self.object_store.start()

    def ask(self, sql: str, params: list) -> tuple:
        """One row of a query over the live ledger (its tables' current snapshot)."""
        return queries.connect(self.root).execute(sql, params).fetchone()

    def counts(self, run_id: str) -> tuple[int, int]:
        return self.ask("select count(*), count(distinct event_id) from steps_all where run_id = ?", [run_id])

    def quarantined(self, subject: str) -> int:
        return self.ask("select count(*) from quarantine where subject = ?", [subject])[0]

    def close(self) -> None:
        if self.ledger and self.ledger.poll() is None:
            self.ledger.terminate()
            try:
                self.ledger.wait(30)
            except subprocess.TimeoutExpired:
                self.ledger.kill()
        self.nats.stop()
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.root)], check=False)


def _mount_tmpfs(path: Path, size_mb: int) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)], capture_output=True)
    return r.returncode == 0


def poison_messages(run_id: str, round_: int) -> list[bytes]:
    """The poison phase's hostile messages for one round, for `runledger.{run_id}.step` (issue 13)."""
    payload = {"loss": 2**53 + 1, "grad_norm": 1.0, "lr": 3e-4, "tokens": 8192, "step_time_s": 0.05}
    env = {"event_id": make_event_id(run_id, "poison", 0, round_), "run_id": run_id, "producer": "poison",
           "attempt": 0, "seq": round_, "kind": "step", "time": "2026-12-01T00:00:00.000000Z", "step": round_,
           "schema_version": 1, "prev_hash": "", "payload": payload}
    env["hash"] = event_hash(env, canonical_json(payload))  # hashed correctly: only the number is wrong
    deep = b"[" * 1000 + b"]" * 1000
    return [
        b"[" + deep + b"]",  # a batch entry nested 1,000 deep (orjson reads it; writing it back raised)
        canonical_json(env).encode(),  # a float field holding an integer no double equals (Arrow refused it)
        b"[" + b",".join([b"{}"] * 20_000) + b"]",  # past the entries a batch may hold
        b'{"run_id": "a", "run_id": "b", "payload": {}}',  # duplicate keys
        b'{"payload": {"loss": 1e400}}',  # Infinity in disguise
        b'{"event_id": "\\ud800", "kind": "step"}',  # a lone surrogate
        b'{"payload": {"config": {"seed": 1000000000000000000000000000000}}}',  # an integer past 64 bits
        b"\xff\xfe not UTF-8",
    ]


def publish_poison(url: str, run_id: str, round_: int) -> int:
    async def go() -> int:
        nc = await bus.connect(url)
        js = nc.jetstream()
        await bus.ensure_stream(js)
        bodies = poison_messages(run_id, round_)
        for body in bodies:
            await js.publish(f"runledger.{run_id}.step", body)
        await nc.close()
        return len(bodies)

    return asyncio.run(go())


def run_phase(rig: Rig, fault: str, events: int, faults: int, rate: float, rng: random.Random) -> PhaseResult:
    run_id = f"chaos-{fault}"
    t0 = time.monotonic()
    if fault == "disk-full":  # each fault holds until the ledger has failed a write: keep the stream going
        rate = min(rate, events / (faults * 6.0))
    duration = events / rate
    gap = duration / (faults + 1)
    prod = rig.producer(run_id, events, rate)
    note = ""
    injected = poisoned = 0
    for _ in range(faults):
        time.sleep(gap * rng.uniform(0.6, 1.0))
        if fault == "ledger-sigkill":
            rig.kill_ledger()
            rig.start_ledger()
        elif fault == "nats-restart":
            rig.restart_nats(rng.uniform(0.2, 1.0))
        elif fault == "object-store-restart":
            rig.restart_object_store(rng.uniform(1.0, 3.0))
        elif fault == "worker-sigkill":
            if prod.poll() is not None:
                break
            prod.kill()
            prod.wait()
            prod = rig.producer(run_id, events, rate)
        elif fault == "poison":
            poisoned += publish_poison(rig.nats.url, run_id, injected)
            if injected % 2 == 0:  # a fresh ledger meets the poison again, unacked
                rig.kill_ledger()
                rig.start_ledger()
        elif fault == "disk-full":
            before = rig.write_failures()
            filler = rig.fill_disk()
            wait_until = time.monotonic() + 10
            while rig.write_failures() == before and time.monotonic() < wait_until:
                time.sleep(0.1)  # until the ledger has failed to write, kept its batch and said so
            time.sleep(rng.uniform(0.5, 1.5))
            filler.unlink()
        injected += 1
    while prod.wait(600) != 0:  # a producer killed by the last fault: restart it until it finishes
        prod = rig.producer(run_id, events, rate)
    deadline = time.monotonic() + 300
    stored, distinct = rig.counts(run_id)
    while distinct < events and time.monotonic() < deadline:
        time.sleep(0.5)
        stored, distinct = rig.counts(run_id)
    time.sleep(1.0)  # anything still arriving would be a duplicate: give it the chance to show
    stored, distinct = rig.counts(run_id)
    if fault in ("disk-full", "object-store-restart"):
        note = f"ledger said '… not acking' {rig.write_failures()} times"
    if fault == "poison":
        quarantined = rig.quarantined(f"runledger.{run_id}.step")
        alive = rig.ledger.poll() is None
        note = f"{poisoned} poison messages, {quarantined} quarantine rows, ledger {'up' if alive else 'DOWN'}"
        if not alive or quarantined < poisoned:
            note += " (FAILED)"
    return PhaseResult(fault, injected, events, stored, distinct, time.monotonic() - t0, note)


FAULTS = ["ledger-sigkill", "nats-restart", "worker-sigkill", "disk-full", "poison"]


def run(base: Path, kinds: list[str], events: int, faults: int, rate: float, seed: int = 1,
        warehouse: str | None = None, object_store=None):
    """Every phase of `kinds` on one rig under `base`: (the phases' results, verify's report, the log's audit
    line). With `warehouse` the tables are in that bucket; `object_store` (kill(), start()) is its server."""
    rng = random.Random(seed)
    os.environ.setdefault("RUNLEDGER_TLOG_KEY", str(base / "keys" / "tlog.key"))  # the log's key, outside the root
    rig = Rig(base, tmpfs_mb=1024, warehouse=warehouse, object_store=object_store)
    results = []
    try:
        for fault in kinds:
            skip = ("needs root to mount a tmpfs" if fault == "disk-full" and not rig.tmpfs else
                    "needs an object server to restart" if fault == "object-store-restart" and object_store is None
                    else None)
            if skip:
                results.append(PhaseResult(fault, 0, 0, 0, 0, 0.0, f"skipped: {skip}"))
                continue
            log.info("phase %s: %d events, %d faults", fault, events, faults)
            results.append(run_phase(rig, fault, events, faults, rate, rng))
            r = results[-1]
            log.info("phase %s: emitted %d stored %d lost %d duplicated %d", fault, r.emitted, r.stored, r.lost, r.duplicated)
        return results, verify(rig.root), audit_log(rig.root)
    finally:
        rig.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="repeated faults during event streams; counts every event")
    p.add_argument("--quick", action="store_true", help="a short version (<= 5 minutes)")
    p.add_argument("--events", type=int, default=None, help="events per fault phase (default 60,000; quick 15,000)")
    p.add_argument("--faults", type=int, default=5, help="injections per fault kind")
    p.add_argument("--rate", type=float, default=None, help="events/s per producer (default 4,000; quick 3,000)")
    p.add_argument("--only", nargs="*", default=None, help="fault kinds to run")
    p.add_argument("--keep", default=None, help="keep the run's files in this directory")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--warehouse", default=None,
                   help="keep the tables in this bucket (s3://bucket/prefix; credentials from the AWS_* variables)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    redact.install()
    events = args.events or (15_000 if args.quick else 60_000)
    rate = args.rate or (3_000 if args.quick else 4_000)
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="runledger-chaos-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        results, report, logged = run(base, args.only or FAULTS, events, args.faults, rate, args.seed, args.warehouse)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(table(results))
    print(f"verify: {'ok' if report.ok else 'FAILED'} ({report.events} events, {len(report.problems)} problems)")
    for problem in report.problems[:10]:
        print(f"  - {problem}")
    print(f"tlog: {logged}")
    return 0 if passed(results, report, logged) else 1


def table(results: list[PhaseResult]) -> str:
    """The phases' account, one line each and a total."""
    lines = [f"{'fault':<21}{'injected':>9}{'emitted':>10}{'stored':>10}{'lost':>7}{'duplicated':>11}{'seconds':>9}  note"]
    total = PhaseResult("total", sum(r.injected for r in results), sum(r.emitted for r in results),
                        sum(r.stored for r in results), sum(r.distinct for r in results), sum(r.seconds for r in results))
    for r in [*results, total]:
        lines.append(f"{r.fault:<21}{r.injected:>9}{r.emitted:>10}{r.stored:>10}{r.lost:>7}{r.duplicated:>11}"
                     f"{r.seconds:>9.1f}  {r.note}".rstrip())
    return "\n".join(lines)


def passed(results: list[PhaseResult], report, logged: str) -> bool:
    """Nothing lost or doubled in any phase, no phase failed, verify ok and the log's audit ok."""
    return (report.ok and all(r.lost == 0 and r.duplicated == 0 and "FAILED" not in r.note for r in results)
            and logged.startswith("ok"))


def audit_log(root: Path, wait_s: float = 30.0) -> str:
    """The transparency log after every fault: `runledger tlog audit` of the root (the tree rebuilt from its
    entries must give the last signed checkpoint's root, and every stored event must be a leaf of it and
    every leaf an event). The ledger signs within seconds of going idle: tried until then."""
    from runledger.ledger.tlog import audit, note
    from runledger.ledger.tlog import log as tlog

    if not tlog.enabled():
        return "ok: off ($RUNLEDGER_TLOG)"
    verifier = note.read_key(tlog.key_file()).verifier
    deadline = time.monotonic() + wait_s
    while True:
        try:
            done = audit.audit(str(tlog.log_dir(root)), [verifier], root, seen=root.parent / "tlog-seen",
                               check_chains=False)
            return done.text().splitlines()[-1]
        except audit.AuditFailed as err:
            if time.monotonic() > deadline:
                return f"FAILED: {err}"
            time.sleep(1.0)


if __name__ == "__main__":
    sys.exit(main())
