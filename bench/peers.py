"""The same training metrics logged through runledger, MLflow, W&B (offline) and TensorBoard, side by side.

    pip install -e '.[peers]'
    python -m bench.peers [--steps N | --large] [--step-ms MS] [--only runledger,mlflow,...]

Every peer logs, for N steps, the same 13 numbers (loss, grad_norm, lr, mfu, drop_fraction and the
drop fraction of each of 8 MoE layers), each in its own fresh process, one after the other:
  runledger    Emitter.emit_dict of a `step` and a `drops` event per step → spool → a real nats-server →
               the ledger service (a second process) → fsync'd Parquet, queried with queries.connect
  mlflow       mlflow.log_metrics(dict, step) into a sqlite backend, asynchronously (the fastest
               per-step API: synchronous=False) and, with --only ...,mlflow-sync, the synchronous default
  wandb        wandb.init(mode="offline") and run.log(dict, step) into the local .wandb file
  tensorboard  tensorboardX SummaryWriter.add_scalar per metric into an event file
Measured per peer: the time spent inside the logging calls of the training loop (per step), the
time from the loop's end until the data is durable and can be queried (runledger: the ledger
service has fsync'd it to Parquet and queries.connect counts every row; the peers: their
end_run/finish/close returned), and the time to answer two questions from each store: the max
grad_norm per 1,000-step window, and the steps whose drop fraction is above 7% (Marin's alert
threshold). MLflow is asked twice: SQL on its sqlite file, and its client's get_metric_history.
W&B has no offline query path, so its .wandb file is read whole (see WandbFileStore). Every answer
is checked against the numbers logged. Ratios are runledger/peer from the same command (below 1:
runledger is faster); the machine's other load moves absolute numbers, the ratios much less.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import logging
import math
import multiprocessing as mp
import os
import random
import shutil
import sqlite3
import statistics
import struct
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path


log = logging.getLogger("bench.peers")

RUN_ID = "peers"
LAYERS = 8
TOKENS = 8192  # tokens per step
TOP_K = 2
LAYER_ASSIGNMENTS = TOKENS * TOP_K  # A = local tokens x top-k (DESIGN.md, MoE accounting)
DROP_ALERT = 0.07  # Marin alert: drop fraction > 7%
WINDOW = 1_000  # steps per window of the grad-norm question
QUERY_REPS = 5  # warm repetitions of each question; the median is reported
PEERS = ("runledger", "mlflow", "mlflow-sync", "wandb", "tensorboard")
DEFAULT_PEERS = ("runledger", "mlflow", "wandb", "tensorboard")  # mlflow-sync: ~25 ms/step, on request


# ------------------------------------------------------------------------------ the metrics


@dataclass
class Step:
    """One step's numbers, as each peer is given them (built before any clock starts)."""

    step: int
    scalars: dict[str, float]  # the 13 numbers the peers log
    step_payload: dict  # runledger's `step` event
    drops_payload: dict  # runledger's `drops` event (per-layer counts as well as fractions)


def lr_at(step: int, n: int, peak: float = 3e-4, warmup: int = 100) -> float:
    if step <= warmup:
        return peak * step / warmup
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, n - warmup))))


def make_steps(n: int, seed: int = 8) -> list[Step]:
    """Deterministic synthetic metrics for steps 1..n, with grad-norm spikes and drop bursts."""
    rng = random.Random(seed)
    out = []
    for s in range(1, n + 1):
        base = 0.035 + 0.015 * math.sin(2 * math.pi * s / 2_000) + rng.gauss(0, 0.004)
        if rng.random() < 0.03:
            base += 0.05  # a burst of drops
        layers = []
        for layer in range(LAYERS):
            f = max(0.0, base * (0.6 + 0.1 * layer))
            sender = round(f * LAYER_ASSIGNMENTS * 0.4)
            receiver = round(f * LAYER_ASSIGNMENTS * 0.6)
            layers.append([layer, sender, receiver])
        dropped = sum(sd + rc for _, sd, rc in layers)
        while abs(dropped / (LAYER_ASSIGNMENTS * LAYERS) - DROP_ALERT) < 1e-6:  # keep float32 stores unambiguous
            layers[0][2] += 1
            dropped += 1
        drop_fraction = dropped / (LAYER_ASSIGNMENTS * LAYERS)
        grad_norm = 1.0 + 0.2 * math.sin(s / 300) + abs(rng.gauss(0, 0.05)) + (2.0 if rng.random() < 0.005 else 0.0)
        loss = 2.5 + 8.0 / (1 + s / 200) ** 0.5 + rng.gauss(0, 0.02)
        mfu = 0.31 + rng.gauss(0, 0.005)
        lr = lr_at(s, n)
        scalars = {"loss": loss, "grad_norm": grad_norm, "lr": lr, "mfu": mfu, "drop_fraction": drop_fraction}
        layer_rows = []
        for layer, sd, rc in layers:
            scalars[f"drop_fraction/layer_{layer}"] = (sd + rc) / LAYER_ASSIGNMENTS
            layer_rows.append({"layer": layer, "assignments": LAYER_ASSIGNMENTS, "sender_dropped": sd,
                               "receiver_dropped": rc, "drop_fraction": (sd + rc) / LAYER_ASSIGNMENTS})
        step_payload = {"loss": loss, "grad_norm": grad_norm, "lr": lr, "tokens": TOKENS, "step_time_s": 0.5, "mfu": mfu}
        drops_payload = {"dispatch": "capacity", "assignments": LAYER_ASSIGNMENTS * LAYERS, "dropped": dropped,
                         "drop_fraction": drop_fraction, "layers": layer_rows}
        out.append(Step(s, scalars, step_payload, drops_payload))
    return out


@dataclass
class Answers:
    """The two questions' answers: {window: max grad_norm} and the steps with drop_fraction > 7%."""

    max_grad_norm: dict[int, float]
    high_drop_steps: list[int]

    @classmethod
    def of(cls, grad_norms: list[tuple[int, float]], drop_fractions: list[tuple[int, float]]) -> "Answers":
        mx: dict[int, float] = {}
        for s, v in grad_norms:
            w = (s - 1) // WINDOW
            if w not in mx or v > mx[w]:
                mx[w] = v
        return cls(mx, sorted(s for s, v in drop_fractions if v > DROP_ALERT))

    def differences(self, truth: "Answers", rel: float = 1e-6) -> str:
        """'' when these answers match the truth (float32 stores are within `rel`), else what differs."""
        if sorted(self.max_grad_norm) != sorted(truth.max_grad_norm):
            return f"windows {sorted(self.max_grad_norm)} != {sorted(truth.max_grad_norm)}"
        for w, v in truth.max_grad_norm.items():
            if not math.isclose(self.max_grad_norm[w], v, rel_tol=rel):
                return f"window {w}: max grad_norm {self.max_grad_norm[w]} != {v}"
        if self.high_drop_steps != truth.high_drop_steps:
            return f"{len(self.high_drop_steps)} high-drop steps != {len(truth.high_drop_steps)}"
        return ""


def truth_of(steps: list[Step]) -> Answers:
    return Answers.of([(s.step, s.scalars["grad_norm"]) for s in steps],
                      [(s.step, s.scalars["drop_fraction"]) for s in steps])


# ------------------------------------------------------------------------------ logging, one process per peer


@dataclass
class Logged:
    """What one peer's logging process measured (times from time.time(), comparable across processes)."""

    setup_s: float = 0.0  # creating the logger (run, writer, emitter)
    log_s: float = 0.0  # inside the logging calls of the loop, summed
    loop_start: float = 0.0
    loop_end: float = 0.0
    durable_at: float = 0.0  # everything logged is on disk in the peer's store
    where: dict = field(default_factory=dict)  # what the query side needs to find the data


def _loop(steps: list[Step], step_s: float, log_one) -> tuple[float, float, float]:
    """The training loop: `step_s` of simulated work (the GIL released, as during a device step), then log."""
    perf = time.perf_counter
    inside = 0.0
    start = time.time()
    for st in steps:
        if step_s:
            time.sleep(step_s)
        t = perf()
        log_one(st)
        inside += perf() - t
    return start, time.time(), inside


def log_runledger(url: str, spool: str, n: int, step_s: float, q) -> None:
    from ledger.emitter import Emitter

    steps = make_steps(n)
    t = time.time()
    em = Emitter(RUN_ID, "worker-0", 0, url, spool)
    setup = time.time() - t

    def log_one(st: Step) -> None:
        em.emit_dict("step", st.step_payload, step=st.step)  # (every peer is handed the same dicts)
        em.emit_dict("drops", st.drops_payload, step=st.step)

    start, end, inside = _loop(steps, step_s, log_one)
    ok = em.close(600)
    q.put(("producer", vars(Logged(setup, inside, start, end, time.time(), {"acked": ok}))))


def serve_ledger(url: str, root: str, n_events: int, q) -> None:
    from ledger import service

    counters = asyncio.run(service.serve(root, url, stop=asyncio.Event(), until_stored=n_events))
    q.put(("ledger", time.time(), counters.stored, counters.messages))


def log_mlflow(db: str, n: int, step_s: float, synchronous: bool, q) -> None:
    import mlflow

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    steps = make_steps(n)
    t = time.time()
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    mlflow.set_experiment("peers")
    run = mlflow.start_run()
    setup = time.time() - t
    log_metrics = mlflow.log_metrics
    start, end, inside = _loop(steps, step_s, lambda st: log_metrics(st.scalars, step=st.step, synchronous=synchronous))
    mlflow.end_run()  # waits for the async queue to be written
    q.put(("mlflow", vars(Logged(setup, inside, start, end, time.time(), {"db": db, "run_id": run.info.run_id}))))


def log_wandb(wandb_dir: str, n: int, step_s: float, q) -> None:
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=wandb_dir)
    import wandb

    steps = make_steps(n)
    t = time.time()
    # system-metrics sampling and console capture off: less CPU taken from the loop (kind to the peer)
    run = wandb.init(project="peers", dir=wandb_dir, mode="offline",
                     settings=wandb.Settings(x_disable_stats=True, console="off", save_code=False, disable_git=True))
    setup = time.time() - t
    start, end, inside = _loop(steps, step_s, lambda st: run.log(st.scalars, step=st.step))
    run.finish()
    files = glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "*.wandb"))
    q.put(("wandb", vars(Logged(setup, inside, start, end, time.time(), {"file": files[0]}))))


def log_tensorboard(logdir: str, n: int, step_s: float, q) -> None:
    from tensorboardX import SummaryWriter

    steps = make_steps(n)
    t = time.time()
    writer = SummaryWriter(logdir)
    setup = time.time() - t
    add = writer.add_scalar

    def log_one(st: Step) -> None:
        for k, v in st.scalars.items():
            add(k, v, st.step)

    start, end, inside = _loop(steps, step_s, log_one)
    writer.close()
    q.put(("tensorboard", vars(Logged(setup, inside, start, end, time.time(), {"logdir": logdir}))))


def _results(q, procs: list, expect: int, timeout: float = 3600) -> list:
    """`expect` results from the queue; fails at once (not after `timeout`) if a process died without one."""
    import queue as queue_mod

    out, deadline = [], time.monotonic() + timeout
    while len(out) < expect:
        try:
            out.append(q.get(timeout=1.0))
        except queue_mod.Empty:
            dead = [p for p in procs if not p.is_alive() and p.exitcode != 0]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"{', '.join(p.name for p in dead) or 'a peer'} ended without a result "
                                   f"(exit codes {[p.exitcode for p in procs]})") from None
    return out


def _run(ctx, target, args: tuple) -> Logged:
    """Run one peer's logging process; what it measured (plain dicts cross the process boundary)."""
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q), name=target.__name__)
    p.start()
    (_, measured), = _results(q, [p], 1)
    p.join()
    return Logged(**measured)


def run_runledger(ctx, tmp: Path, n: int, step_s: float) -> Logged:
    from ledger.natsserver import NatsServer

    srv = NatsServer(tmp / "nats").start()
    try:
        q = ctx.Queue()
        ledger = ctx.Process(target=serve_ledger, args=(srv.url, str(tmp / "root"), 2 * n, q), name="ledger")
        ledger.start()
        time.sleep(2.0)  # the ledger is connected and waiting
        producer = ctx.Process(target=log_runledger, args=(srv.url, str(tmp / "spool"), n, step_s, q), name="producer")
        producer.start()
        got = {r[0]: r for r in _results(q, [ledger, producer], 2)}
        producer.join()
        ledger.join()
    finally:
        srv.stop()
    logged = Logged(**got["producer"][1])
    _, stored_at, stored, messages = got["ledger"]
    assert stored == 2 * n, f"the ledger stored {stored} of {2 * n} events"
    logged.durable_at = stored_at
    logged.where = {"root": str(tmp / "root"), "messages": messages, "acked": logged.where["acked"]}
    return logged


# ------------------------------------------------------------------------------ answering the questions from each store


class RunledgerStore:
    """DuckDB over the ledger's Parquet, through the same views every audit uses."""

    def __init__(self, where: dict) -> None:
        import queries

        self.con = queries.connect(where["root"])

    def count(self) -> int:
        return self.con.execute("select (select count(*) from steps) + (select count(*) from drops)").fetchall()[0][0]

    def q1(self) -> dict[int, float]:
        rows = self.con.execute(f"select (step - 1) // {WINDOW} as w, max(grad_norm) from steps where run_id = ? "
                                "group by w order by w", [RUN_ID]).fetchall()
        return dict(rows)

    def q2(self) -> list[int]:
        return [r[0] for r in self.con.execute("select step from drops where run_id = ? and drop_fraction > ? "
                                               "order by step", [RUN_ID, DROP_ALERT]).fetchall()]


class MlflowSqlStore:
    """SQL straight on MLflow's sqlite file (its `metrics` table: key, value, step, run_uuid)."""

    def __init__(self, where: dict) -> None:
        self.run_id = where["run_id"]
        self.con = sqlite3.connect(f"file:{where['db']}?mode=ro", uri=True)

    def q1(self) -> dict[int, float]:
        return dict(self.con.execute(f"select (step - 1) / {WINDOW} as w, max(value) from metrics "
                                     "where run_uuid = ? and key = 'grad_norm' group by w order by w",
                                     (self.run_id,)).fetchall())

    def q2(self) -> list[int]:
        return [r[0] for r in self.con.execute("select step from metrics where run_uuid = ? and key = 'drop_fraction' "
                                               "and value > ? order by step", (self.run_id, DROP_ALERT)).fetchall()]


class MlflowApiStore:
    """MLflow's own client: get_metric_history, then the question in Python."""

    def __init__(self, where: dict) -> None:
        from mlflow.tracking import MlflowClient

        self.run_id = where["run_id"]
        self.client = MlflowClient(tracking_uri=f"sqlite:///{where['db']}")

    def _history(self, key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in self.client.get_metric_history(self.run_id, key)]

    def q1(self) -> dict[int, float]:
        return Answers.of(self._history("grad_norm"), []).max_grad_norm

    def q2(self) -> list[int]:
        return Answers.of([], self._history("drop_fraction")).high_drop_steps


class WandbFileStore:
    """The offline run's .wandb file, read whole: W&B has no offline query path (the public API needs
    the server, after `wandb sync`), and wandb 0.31 no longer ships its Python reader (the old
    wandb.sdk.internal.datastore), so this is that reader's few lines: the LevelDB-style log format
    (7-byte header ':W&B', 0xBEE1, version; 32 KiB blocks of records with a 7-byte header of crc32,
    length and type FULL/FIRST/MIDDLE/LAST), each record a `wandb_internal_pb2.Record` from the SDK,
    history items decoded from their JSON values. CRCs are not checked (less work for the peer)."""

    BLOCK = 32 * 1024
    HEADER = struct.Struct("<IHB")

    def __init__(self, where: dict) -> None:
        import json

        from wandb.proto import wandb_internal_pb2 as pb

        self.series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        data = Path(where["file"]).read_bytes()
        ident, magic, _version = struct.unpack_from("<4sHB", data, 0)
        assert ident == b":W&B" and magic == 0xBEE1, "not a W&B run file"
        loads = json.loads
        record = pb.Record()
        pos, chunks = 7, []
        while pos + 7 <= len(data):
            room = self.BLOCK - pos % self.BLOCK
            if room < 7:  # the rest of a block too small for a header is padding
                pos += room
                continue
            _crc, length, kind = self.HEADER.unpack_from(data, pos)
            if length == 0 and kind == 0:  # zero padding at the end of a block
                pos += room
                continue
            chunks.append(data[pos + 7:pos + 7 + length])
            pos += 7 + length
            if kind in (1, 4):  # FULL or LAST: a whole record
                record.ParseFromString(b"".join(chunks))
                chunks = []
                if record.WhichOneof("record_type") == "history":
                    h = record.history
                    step = h.step.num
                    for item in h.item:
                        key = item.key or "/".join(item.nested_key)
                        self.series[key].append((step, loads(item.value_json)))

    def count(self) -> int:
        return len(self.series["grad_norm"]) + len(self.series["drop_fraction"])

    def q1(self) -> dict[int, float]:
        return Answers.of(self.series["grad_norm"], []).max_grad_norm

    def q2(self) -> list[int]:
        return Answers.of([], self.series["drop_fraction"]).high_drop_steps


class TensorboardStore:
    """TensorBoard's EventAccumulator over the event file (every scalar kept: size_guidance 0)."""

    def __init__(self, where: dict) -> None:
        from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

        self.acc = EventAccumulator(where["logdir"], size_guidance={SCALARS: 0})
        self.acc.Reload()

    def count(self) -> int:
        return len(self.acc.Scalars("grad_norm")) + len(self.acc.Scalars("drop_fraction"))

    def q1(self) -> dict[int, float]:
        return Answers.of([(e.step, e.value) for e in self.acc.Scalars("grad_norm")], []).max_grad_norm

    def q2(self) -> list[int]:
        return Answers.of([], [(e.step, e.value) for e in self.acc.Scalars("drop_fraction")]).high_drop_steps


STORES = {"runledger": RunledgerStore, "mlflow": MlflowSqlStore, "mlflow-api": MlflowApiStore,
          "mlflow-sync": MlflowSqlStore, "wandb": WandbFileStore, "tensorboard": TensorboardStore}


@dataclass
class Queried:
    open_s: float  # opening the store (for wandb and tensorboard: reading the whole file)
    q1_s: float  # median warm time, store open
    q2_s: float
    cold_s: float  # open + q1 + q2, the first time
    differs: str  # '' when both answers match the numbers logged


IMPORTS = {"runledger": ["queries", "duckdb"], "mlflow": ["sqlite3"], "mlflow-sync": ["sqlite3"],
           "mlflow-api": ["mlflow.tracking"], "wandb": ["wandb.proto.wandb_internal_pb2"],
           "tensorboard": ["tensorboard.backend.event_processing.event_accumulator"]}


def query(name: str, where: dict, truth: Answers) -> Queried:
    """Open the store and answer both questions, cold then warm; imports are done before any clock."""
    import importlib

    for module in IMPORTS[name]:
        importlib.import_module(module)
    store_cls = STORES[name]
    perf = time.perf_counter
    t0 = perf()
    store = store_cls(where)
    t1 = perf()
    a1 = store.q1()
    t2 = perf()
    a2 = store.q2()
    t3 = perf()
    q1s, q2s = [], []
    for _ in range(QUERY_REPS):
        t = perf()
        store.q1()
        q1s.append(perf() - t)
        t = perf()
        store.q2()
        q2s.append(perf() - t)
    return Queried(t1 - t0, statistics.median(q1s), statistics.median(q2s), t3 - t0,
                   Answers(a1, a2).differences(truth))


# ------------------------------------------------------------------------------ main


def main() -> int:
    p = argparse.ArgumentParser(description="runledger vs MLflow, W&B offline and TensorBoard: the same metrics, one run")
    p.add_argument("--steps", type=int, default=5_000, help="training steps to log (default 5,000: about 3 minutes here)")
    p.add_argument("--large", action="store_true", help="50,000 steps (tens of minutes: MLflow is the slow one)")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="simulated device time per step, GIL released (default 0: a tight loop, the worst case "
                        "for loggers that work in a background thread of the training process)")
    p.add_argument("--only", default=",".join(DEFAULT_PEERS),
                   help=f"comma-separated subset of {','.join(PEERS)} (default: all but mlflow-sync)")
    p.add_argument("--keep", action="store_true", help="keep the stores (their folder is printed)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("tensorboard").setLevel(logging.WARNING)  # "No path found after ...": the file was read whole
    n = 50_000 if args.large else args.steps
    step_s = args.step_ms / 1000
    only = [x for x in PEERS if x in args.only.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="rl-bench-peers-"))
    ctx = mp.get_context("spawn")  # every peer in a fresh interpreter: no shared imports, threads or state
    truth = truth_of(make_steps(n))
    logged: dict[str, Logged] = {}
    queried: dict[str, Queried] = {}
    errors: dict[str, str] = {}
    t_all = time.time()
    try:
        for name in only:
            log.info("logging %d steps through %s", n, name)
            try:
                if name == "runledger":
                    logged[name] = run_runledger(ctx, tmp / name, n, step_s)
                elif name in ("mlflow", "mlflow-sync"):
                    (tmp / name).mkdir()
                    logged[name] = _run(ctx, log_mlflow, (str(tmp / name / "mlflow.db"), n, step_s, name == "mlflow-sync"))
                elif name == "wandb":
                    (tmp / name).mkdir()
                    logged[name] = _run(ctx, log_wandb, (str(tmp / name), n, step_s))
                elif name == "tensorboard":
                    logged[name] = _run(ctx, log_tensorboard, (str(tmp / name), n, step_s))
            except Exception as err:  # a peer that cannot run here is reported, the others go on
                errors[name] = f"{type(err).__name__}: {err}"
                log.exception("%s failed", name)
        columns = [x for x in only if x in logged]
        if "mlflow" in logged:
            columns.insert(columns.index("mlflow") + 1, "mlflow-api")
            logged["mlflow-api"] = logged["mlflow"]
        for name in columns:
            log.info("answering the questions from %s", name)
            try:
                queried[name] = query(name, logged[name].where, truth)
            except Exception as err:
                errors[name] = f"{type(err).__name__}: {err}"
                log.exception("querying %s failed", name)
        # queryable: the store opened and counted, right after it was durable
        for name, cls in (("runledger", RunledgerStore),):
            if name in logged:
                t = time.perf_counter()
                got = cls(logged[name].where).count()
                logged[name].where["count_s"] = time.perf_counter() - t
                assert got == 2 * n, f"{name}: {got} rows, expected {2 * n}"
    finally:
        if args.keep:
            print(f"stores kept under {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print_table(n, args.step_ms, truth, logged, queried, errors, time.time() - t_all)
    return 1 if errors or any(q.differs for q in queried.values()) else 0


def print_table(n: int, step_ms: float, truth: Answers, logged: dict[str, Logged], queried: dict[str, Queried],
                errors: dict[str, str], wall: float) -> None:
    names = [x for x in ("runledger", "mlflow", "mlflow-api", "mlflow-sync", "wandb", "tensorboard") if x in queried or x in logged]
    rl_l, rl_q = logged.get("runledger"), queried.get("runledger")

    def ttq(lg: Logged) -> float:  # loop end → durable and queryable
        return lg.durable_at - lg.loop_end + lg.where.get("count_s", 0.0)

    def total(lg: Logged) -> float:  # first log call → durable and queryable
        return lg.durable_at - lg.loop_start + lg.where.get("count_s", 0.0)

    rows = [  # (label, unit scale, value of a peer or None)
        ("setup (create logger) [s]", 1, lambda x: logged[x].setup_s if x in logged and x != "mlflow-api" else None),
        ("loop overhead / step [us]", 1e6, lambda x: logged[x].log_s / n if x in logged and x != "mlflow-api" else None),
        ("loop end -> durable+queryable [s]", 1, lambda x: ttq(logged[x]) if x in logged and x != "mlflow-api" else None),
        ("first log -> durable+queryable [s]", 1, lambda x: total(logged[x]) if x in logged and x != "mlflow-api" else None),
        ("open store [ms]", 1e3, lambda x: queried[x].open_s if x in queried else None),
        (f"Q1 max grad_norm / {WINDOW} steps [ms]", 1e3, lambda x: queried[x].q1_s if x in queried else None),
        (f"Q2 steps drop_fraction > {DROP_ALERT} [ms]", 1e3, lambda x: queried[x].q2_s if x in queried else None),
        ("cold: open + Q1 + Q2 [ms]", 1e3, lambda x: queried[x].cold_s if x in queried else None),
    ]
    print()
    print(f"{n} steps x 13 metrics (runledger: {2 * n} events, `step` + `drops` with per-layer counts); "
          f"simulated device time {step_ms} ms/step; {os.cpu_count()} CPUs; whole bench {wall:.0f} s")
    print(f"truth: {len(truth.max_grad_norm)} windows, {len(truth.high_drop_steps)} steps with drop_fraction > {DROP_ALERT}")
    print("cells: value (runledger/peer; below 1 = runledger faster). mlflow = async log_metrics, queried with SQL on "
          "its sqlite; mlflow-api = the same run through MlflowClient.get_metric_history; mlflow-sync = synchronous log_metrics")
    width = 22
    print(f"{'measure':<38}" + "".join(f"{x:>{width}}" for x in names))
    for label, scale, get in rows:
        cells = []
        for x in names:
            v = get(x)
            if v is None:
                cells.append(f"{'-':>{width}}")
                continue
            rl = get("runledger") if "runledger" in names else None
            txt = f"{v * scale:.4g}" if x == "runledger" or rl is None else f"{v * scale:.4g} ({rl / v if v else float('inf'):.3g})"
            cells.append(f"{txt:>{width}}")
        print(f"{label:<38}" + "".join(cells))
    print(f"{'answers match the logged numbers':<38}" + "".join(
        f"{('yes' if not queried[x].differs else 'NO') if x in queried else 'n/a':>{width}}" for x in names))
    for x in names:
        if x in queried and queried[x].differs:
            print(f"  {x}: {queried[x].differs}")
    if rl_l is not None:
        print(f"runledger: {rl_l.where['messages']} NATS messages for {2 * n} events; all acked: {rl_l.where['acked']}")
    for x, e in errors.items():
        print(f"  {x} could not run: {e}")
    if rl_l is not None and rl_q is not None:
        peers = [x for x in names if x not in ("runledger", "mlflow-api")]
        ov = {x: logged[x].log_s for x in peers if x in logged}
        print("targets: per-step overhead below every peer: " +
              ("met" if ov and all(rl_l.log_s < v for v in ov.values()) else "MISSED") +
              (f" (max ratio {max(rl_l.log_s / v for v in ov.values()):.2f})" if ov else ""))
        for m in ("mlflow", "mlflow-api"):
            if m in queried:
                r1, r2 = queried[m].q1_s / rl_q.q1_s, queried[m].q2_s / rl_q.q2_s
                rc = queried[m].cold_s / rl_q.cold_s
                print(f"targets: query >= 10x faster than {m}: Q1 {r1:.1f}x, Q2 {r2:.1f}x, cold {rc:.1f}x -> " +
                      ("met" if min(r1, r2) >= 10 else "MISSED"))


if __name__ == "__main__":
    raise SystemExit(main())
