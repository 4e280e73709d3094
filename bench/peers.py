"""The same training metrics logged through runledger, MLflow, W&B (offline), TensorBoard and Trackio, side by side.

    pip install -e '.[peers]'
    python -m bench.peers [--steps N | --large] [--step-ms MS] [--only runledger,mlflow,...]
    python -m bench.peers --freeform [--steps N] [--step-ms MS] [--only ...]   # runledger.log, 20 names a step
    python -m bench.peers --query [--query-steps N] [--only runledger,mlflow,trackio]

Every peer logs, for N steps, the same 13 numbers (loss, grad_norm, lr, mfu, drop_fraction and the
drop fraction of each of 8 MoE layers), each in its own fresh process, one after the other:
  runledger    Emitter.emit_dict of a `step` and a `drops` event per step → spool → a real nats-server →
               the ledger service (a second process) → fsync'd Parquet, queried with queries.connect
  mlflow       mlflow.log_metrics(dict, step) into a sqlite backend, asynchronously (the fastest
               per-step API: synchronous=False) and, with --only ...,mlflow-sync, the synchronous default
  wandb        wandb.init(mode="offline") and run.log(dict, step) into the local .wandb file
  tensorboard  tensorboardX SummaryWriter.add_scalar per metric into an event file
  trackio      trackio.init (local SQLite) and trackio.log(dict, step), a background thread writing
               the queue every 0.5 s; asked with SQL (json_extract) on its sqlite file
Measured per peer: the time spent inside the logging calls of the training loop (per step), the
time from the loop's end until the data is durable and can be queried (runledger: the ledger
service has fsync'd it to Parquet and queries.connect counts every row; the peers: their
end_run/finish/close returned), and the time to answer two questions from each store: the max
grad_norm per 1,000-step window, and the steps whose drop fraction is above 7% (Marin's alert
threshold). MLflow is asked twice: SQL on its sqlite file, and its client's get_metric_history.
W&B has no offline query path, so its .wandb file is read whole (see WandbFileStore). Every answer
is checked against the numbers logged. Ratios are runledger/peer from the same command (below 1:
runledger is faster); the machine's other load moves absolute numbers, the ratios much less.

--freeform (issue 16): the one-line logging API, `runledger.log(dict, step=)` into `runledger.init(root=)`,
against the same peers' free-form calls, 20 names a step (`train/loss`, `router/layer_3/entropy`, ...).
Measured as above (overhead per step, loop end → durable; runledger: `run.finish()`, then the `metrics`
view counts every row), and what survives a crash: each peer logs the same steps once more and its
process ends at the loop's end with os._exit (no finish, no atexit, its threads gone); the steps its
store holds then are counted (once any helper process it started, W&B's wandb-core, has exited).

--query (issue 16): one run of 1,000,000 steps x 20 names in each store, and "the max of one name per
1,000 steps" in SQL: DuckDB over the long-form `metrics` view (runledger) and through `metric(name)`,
which reads the name's own column of the stored events (runledger-col), SQLite on MLflow's `metrics` table and on Trackio's (a JSON object per
step: json_extract). Each store is created by its own library (a real run that logs step 0, so the
schema and indexes are its own); the other steps are then written in bulk into its own tables (sqlite3
executemany; runledger: runledger.ledger.emit.sink.ParquetSink, the ledger's writer), because logging 20M numbers
through the peers' APIs takes hours. Each store is asked in a fresh process: cold = open + the first
query (the OS page cache is warm: the files were just written), warm = median of QUERY_REPS more.
Ratios peer/runledger.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import itertools
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
PEERS = ("runledger", "mlflow", "mlflow-sync", "wandb", "tensorboard", "trackio")
DEFAULT_PEERS = ("runledger", "mlflow", "wandb", "tensorboard", "trackio")  # mlflow-sync: ~25 ms/step, on request
QUERY_PEERS = ("runledger", "mlflow", "trackio")  # the stores with SQL over one file or folder
EPOCH_TOKENS = 1 << 30  # tokens in one pass over the synthetic data set (the free-form `data/epoch`)
SETTLE_S = 10.0  # after a crash, a store is counted once it has not changed for this long
QUERY_STEPS = 1_000_000  # the --query run: 1M steps x 20 names (issue 16)
QUERY_CHUNK = 50_000  # steps generated and written at a time (a multiple of WINDOW)
QUERY_KEY = "train/grad_norm"  # the name asked for: its max per WINDOW steps
STEP_MS = 500  # the --query run's step time, for the peers' timestamps


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


# The 20 names a JAX MoE loop logs free-form (`runledger.log`, `wandb.log`): nested, W&B style
ROUTER_LAYERS = (0, 3, 5, 7)  # the layers whose router it logs by name
EXPERTS = 64  # routed experts per layer: a router's entropy is at most ln 64
FREE_NAMES = ("train/loss", "train/grad_norm", "train/param_norm", "train/lr", "train/z_loss", "train/lb_loss",
              "throughput/mfu", "throughput/tokens_per_second", "throughput/duration",
              *(f"router/layer_{layer}/{what}" for layer in ROUTER_LAYERS for what in ("entropy", "drop_fraction")),
              "optim/update_ratio", "memory/hbm_used_gb", "data/epoch")
assert len(FREE_NAMES) == 20  # issue 16: 20 metrics per step


def make_freeform(n: int, seed: int = 16) -> list[tuple[int, dict[str, float]]]:
    """Steps 1..n of the run of `make_steps`, as a loop logs it free-form: (step, {name: value}), 20 names."""
    rng = random.Random(seed)
    out = []
    for st in make_steps(n):
        x = st.scalars
        duration = 0.5 + abs(rng.gauss(0, 0.01))
        m = {"train/loss": x["loss"], "train/grad_norm": x["grad_norm"],
             "train/param_norm": 310.0 + 0.002 * st.step + rng.gauss(0, 0.05), "train/lr": x["lr"],
             "train/z_loss": 1e-4 * (1 + rng.random()), "train/lb_loss": 0.01 + rng.gauss(0, 1e-3),
             "throughput/mfu": x["mfu"], "throughput/tokens_per_second": TOKENS / duration, "throughput/duration": duration}
        for layer in ROUTER_LAYERS:
            m[f"router/layer_{layer}/entropy"] = math.log(EXPERTS) - abs(rng.gauss(0.1, 0.02))
            m[f"router/layer_{layer}/drop_fraction"] = x[f"drop_fraction/layer_{layer}"]
        m["optim/update_ratio"] = x["lr"] * (1.0 + rng.gauss(0, 0.05))
        m["memory/hbm_used_gb"] = 61.5 + rng.gauss(0, 0.2)
        m["data/epoch"] = st.step * TOKENS / EPOCH_TOKENS
        out.append((st.step, {name: m[name] for name in FREE_NAMES}))
    return out


def series(shape: str, n: int) -> list[tuple[int, dict[str, float]]]:
    """What a peer logs at each step: the 13 numbers of `make_steps` ("step") or the 20 free-form ones ("free")."""
    return make_freeform(n) if shape == "free" else [(st.step, st.scalars) for st in make_steps(n)]


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


def _loop(steps: list, step_s: float, log_one) -> tuple[float, float, float]:
    """The training loop: `step_s` of simulated work (the GIL released, as during a device step), then
    `log_one` of the step's item (a Step, or (step, {name: value}))."""
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
    from runledger.ledger.emit.emitter import Emitter

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
    from runledger.ledger.ingest import service

    counters = asyncio.run(service.serve(root, url, stop=asyncio.Event(), until_stored=n_events))
    q.put(("ledger", time.time(), counters.stored, counters.messages))


# A peer's logger: prepare(folder) sets its environment and imports it (before any clock), the
# constructor is its setup (timed), then log(step, {name: value}) each step, finish() at the end, and
# `where` says where its store is (for the questions asked of it).


class MlflowLogger:
    """mlflow.log_metrics(dict, step) into a sqlite backend, asynchronously (the fastest per-step API)
    unless `synchronous` (MLflow's default)."""

    def __init__(self, folder: str, synchronous: bool = False) -> None:
        import mlflow

        db = os.path.join(folder, "mlflow.db")
        mlflow.set_tracking_uri(f"sqlite:///{db}")
        mlflow.set_experiment("peers")
        run = mlflow.start_run()
        self._log, self.synchronous = mlflow.log_metrics, synchronous
        self.finish = mlflow.end_run  # (waits for the asynchronous queue to be written)
        self.where = {"db": db, "run_id": run.info.run_id}

    @staticmethod
    def prepare(folder: str) -> None:
        import mlflow  # noqa: F401 (imported before the clock starts)

        logging.getLogger("mlflow").setLevel(logging.WARNING)

    def log(self, step: int, metrics: dict) -> None:
        self._log(metrics, step=step, synchronous=self.synchronous)


class MlflowSyncLogger(MlflowLogger):
    def __init__(self, folder: str) -> None:
        super().__init__(folder, synchronous=True)


class WandbLogger:
    """wandb.init(mode="offline") and run.log(dict, step) into the local .wandb file (written by wandb-core,
    a helper process)."""

    def __init__(self, folder: str) -> None:
        import wandb

        # system-metrics sampling and console capture off: less CPU taken from the loop (kind to the peer)
        run = wandb.init(project="peers", dir=folder, mode="offline",
                         settings=wandb.Settings(x_disable_stats=True, console="off", save_code=False, disable_git=True))
        self._log, self.finish = run.log, run.finish
        self.where = {"dir": folder}

    @staticmethod
    def prepare(folder: str) -> None:
        os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=folder)
        import wandb  # noqa: F401

    def log(self, step: int, metrics: dict) -> None:
        self._log(metrics, step=step)


class TensorboardLogger:
    """tensorboardX SummaryWriter.add_scalar per metric into an event file."""

    def __init__(self, folder: str) -> None:
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(folder)
        self.add, self.finish = self.writer.add_scalar, self.writer.close
        self.where = {"logdir": folder}

    @staticmethod
    def prepare(folder: str) -> None:
        import tensorboardX  # noqa: F401

    def log(self, step: int, metrics: dict) -> None:
        add = self.add
        for k, v in metrics.items():
            add(k, v, step)


class TrackioLogger:
    """trackio.init (local: a SQLite file per project under TRACKIO_DIR) and trackio.log(dict, step): the
    call queues the dict; a background thread writes the queue every 0.5 s; trackio.finish() drains it."""

    def __init__(self, folder: str) -> None:
        import trackio
        from trackio.sqlite_storage import SQLiteStorage

        run = trackio.init(project="peers", name=RUN_ID, embed=False, auto_log_gpu=False, auto_log_cpu=False)
        self._log, self.finish = trackio.log, trackio.finish
        self.where = {"db": str(SQLiteStorage.get_project_db_path("peers")), "run_id": run.id}

    @staticmethod
    def prepare(folder: str) -> None:
        # TRACKIO_DIR is read when trackio is imported; sqlite: its default on a local disk, said outright
        os.environ.update(TRACKIO_DIR=folder, TRACKIO_STORAGE_MODE="sqlite", HF_HUB_OFFLINE="1")
        import trackio  # noqa: F401

    def log(self, step: int, metrics: dict) -> None:
        self._log(metrics, step=step)


class RunledgerLogger:
    """The one-line logging API (issue 16): runledger.init(root=) and runledger.log(dict, step=); run.finish()."""

    def __init__(self, folder: str) -> None:
        import runledger

        self.run = runledger.init(project="peers", name=RUN_ID, root=folder, system_metrics=False)
        self._log, self.finish = runledger.log, self.run.finish
        self.where = {"root": folder, "run_id": self.run.run_id}

    @staticmethod
    def prepare(folder: str) -> None:
        import runledger  # noqa: F401

    def log(self, step: int, metrics: dict) -> None:
        self._log(metrics, step=step)


LOGGERS = {"runledger": RunledgerLogger, "mlflow": MlflowLogger, "mlflow-sync": MlflowSyncLogger,
           "wandb": WandbLogger, "tensorboard": TensorboardLogger, "trackio": TrackioLogger}


def log_peer(name: str, folder: str, n: int, step_s: float, shape: str, crash: bool, q) -> None:
    """One peer's logging process: `series(shape, n)` through LOGGERS[name], then its finish, or with
    `crash`, none: the process ends at the loop's end as a crash would end it (os._exit: no finish, no
    atexit handler, every thread gone), after telling the parent which helper processes it started."""
    items = series(shape, n)
    cls = LOGGERS[name]
    cls.prepare(folder)
    t = time.time()
    logger = cls(folder)
    setup = time.time() - t
    log = logger.log
    start, end, inside = _loop(items, step_s, lambda item: log(item[0], item[1]))
    if crash:
        import psutil

        helpers = [c.pid for c in psutil.Process().children(recursive=True)]
        q.put((name, vars(Logged(setup, inside, start, end, 0.0, {**logger.where, "helpers": helpers}))))
        q.close()
        q.join_thread()  # the result is in the pipe
        os._exit(0)
    logger.finish()
    q.put((name, vars(Logged(setup, inside, start, end, time.time(), logger.where))))


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


def _child(ctx, target, args: tuple):
    """Run target(*args, q) in a fresh process; what it put on q (plain dicts cross the process boundary)."""
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q), name=target.__name__)
    p.start()
    (_, result), = _results(q, [p], 1)
    p.join()
    return result


def _run(ctx, name: str, folder: Path, n: int, step_s: float, shape: str, crash: bool = False) -> Logged:
    """Log through one peer in a fresh process; what it measured."""
    folder.mkdir(parents=True, exist_ok=True)
    return Logged(**_child(ctx, log_peer, (name, str(folder), n, step_s, shape, crash)))


def run_runledger(ctx, tmp: Path, n: int, step_s: float) -> Logged:
    from runledger.ledger.bus.natsserver import NatsServer

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
        from runledger import queries

        self.con = queries.connect(where["root"])
        self.run_id = where.get("run_id", RUN_ID)

    def stored(self, key: str) -> int:
        """Steps stored with `key`, logged free-form (`runledger.log`: the `metrics` view)."""
        return self.con.execute("select count(*) from metrics where run_id = ? and key = ?", [self.run_id, key]).fetchall()[0][0]

    def rows(self) -> int:
        """Every free-form number stored for the run."""
        return self.con.execute("select count(*) from metrics where run_id = ?", [self.run_id]).fetchall()[0][0]

    def window_max(self, key: str) -> dict[int, float]:
        """--query: the max of `key` per WINDOW steps."""
        return dict(self.con.execute(f"select step // {WINDOW} as w, max(value) from metrics where run_id = ? and key = ? "
                                     "group by w order by w", [self.run_id, key]).fetchall())

    def count(self) -> int:
        return self.con.execute("select (select count(*) from steps) + (select count(*) from drops)").fetchall()[0][0]

    def q1(self) -> dict[int, float]:
        rows = self.con.execute(f"select (step - 1) // {WINDOW} as w, max(grad_norm) from steps where run_id = ? "
                                "group by w order by w", [RUN_ID]).fetchall()
        return dict(rows)

    def q2(self) -> list[int]:
        return [r[0] for r in self.con.execute("select step from drops where run_id = ? and drop_fraction > ? "
                                               "order by step", [RUN_ID, DROP_ALERT]).fetchall()]


class RunledgerColumnStore(RunledgerStore):
    """--query, the fast way to ask runledger for one metric: the table macro `metric(name)`, the same rows
    as the long-form `metrics` view, read from that name's own column ("metrics/NAME" of the stored events)
    rather than unpivoting every name first."""

    def window_max(self, key: str) -> dict[int, float]:
        return dict(self.con.execute(f"select step // {WINDOW} as w, max(value) from metric(?) where run_id = ? "
                                     "group by w order by w", [key, self.run_id]).fetchall())


class MlflowSqlStore:
    """SQL straight on MLflow's sqlite file (its `metrics` table: key, value, step, run_uuid)."""

    def __init__(self, where: dict) -> None:
        self.run_id = where["run_id"]
        self.con = sqlite3.connect(f"file:{where['db']}?mode=ro", uri=True)

    def stored(self, key: str) -> int:
        return self.con.execute("select count(*) from metrics where run_uuid = ? and key = ?", (self.run_id, key)).fetchall()[0][0]

    def window_max(self, key: str) -> dict[int, float]:
        return dict(self.con.execute(f"select step / {WINDOW} as w, max(value) from metrics where run_uuid = ? and key = ? "
                                     "group by w order by w", (self.run_id, key)).fetchall())

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
        file, = glob.glob(os.path.join(where["dir"], "wandb", "offline-run-*", "*.wandb"))
        data = Path(file).read_bytes()
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
            if pos + 7 + length > len(data):  # a record cut short: the writer was stopped mid-write
                break
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

    def stored(self, key: str) -> int:
        return len(self.series.get(key, ()))

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

    def stored(self, key: str) -> int:
        return len(self.acc.Scalars(key)) if key in self.acc.Tags().get("scalars", ()) else 0

    def q1(self) -> dict[int, float]:
        return Answers.of([(e.step, e.value) for e in self.acc.Scalars("grad_norm")], []).max_grad_norm

    def q2(self) -> list[int]:
        return Answers.of([], [(e.step, e.value) for e in self.acc.Scalars("drop_fraction")]).high_drop_steps


class TrackioSqlStore:
    """SQL straight on Trackio's sqlite file: its `metrics` table holds a row per log call (run_id, step,
    and the dict as a JSON object in `metrics`), so a metric is json_extract(metrics, '$."name"')."""

    def __init__(self, where: dict) -> None:
        self.run_id = where["run_id"]
        self.con = sqlite3.connect(f"file:{where['db']}?mode=ro", uri=True)

    @staticmethod
    def path(key: str) -> str:
        return '$."' + key + '"'

    def stored(self, key: str) -> int:
        return self.con.execute("select count(*) from metrics where run_id = ? and json_extract(metrics, ?) is not null",
                                (self.run_id, self.path(key))).fetchall()[0][0]

    def window_max(self, key: str, first: int = 0) -> dict[int, float]:
        return dict(self.con.execute(f"select (step - ?) / {WINDOW} as w, max(json_extract(metrics, ?)) from metrics "
                                     "where run_id = ? group by w order by w", (first, self.path(key), self.run_id)).fetchall())

    def q1(self) -> dict[int, float]:
        return self.window_max("grad_norm", first=1)

    def q2(self) -> list[int]:
        return [r[0] for r in self.con.execute("select step from metrics where run_id = ? and json_extract(metrics, ?) > ? "
                                               "order by step", (self.run_id, self.path("drop_fraction"), DROP_ALERT)).fetchall()]


STORES = {"runledger": RunledgerStore, "mlflow": MlflowSqlStore, "mlflow-api": MlflowApiStore,
          "mlflow-sync": MlflowSqlStore, "wandb": WandbFileStore, "tensorboard": TensorboardStore,
          "trackio": TrackioSqlStore, "runledger-col": RunledgerColumnStore}


@dataclass
class Queried:
    open_s: float  # opening the store (for wandb and tensorboard: reading the whole file)
    q1_s: float  # median warm time, store open
    q2_s: float
    cold_s: float  # open + q1 + q2, the first time
    differs: str  # '' when both answers match the numbers logged


IMPORTS = {"runledger": ["queries", "duckdb"], "mlflow": ["sqlite3"], "mlflow-sync": ["sqlite3"],
           "mlflow-api": ["mlflow.tracking"], "wandb": ["wandb.proto.wandb_internal_pb2"],
           "tensorboard": ["tensorboard.backend.event_processing.event_accumulator"], "trackio": ["sqlite3"]}


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


# ------------------------------------------------------------------------------ the query at scale (--query)


def query_chunks(n: int, seed: int = 16):
    """The --query run, QUERY_CHUNK steps at a time: (steps, values[step, name]) for steps 0..n-1 and FREE_NAMES,
    seeded: each name's value at step 1 of `make_freeform` times log-normal noise, with grad-norm spikes."""
    import numpy as np

    rng = np.random.default_rng(seed)
    (_, first), = make_freeform(1)
    scale = np.array([first[k] for k in FREE_NAMES])
    spiky = FREE_NAMES.index("train/grad_norm")
    for lo in range(0, n, QUERY_CHUNK):
        steps = np.arange(lo, min(n, lo + QUERY_CHUNK))
        values = scale * np.exp(0.1 * rng.standard_normal((len(steps), len(FREE_NAMES))))
        values[:, spiky] += 2.0 * (rng.random(len(steps)) < 0.005)
        yield steps, values


def query_truth(n: int, key: str = QUERY_KEY) -> dict[int, float]:
    """{window: max of `key`} computed from the generated numbers themselves."""
    k = FREE_NAMES.index(key)
    out: dict[int, float] = {}
    for steps, values in query_chunks(n):
        for w, v in zip((steps[::WINDOW] // WINDOW).tolist(), values[:, k].reshape(-1, WINDOW).max(axis=1).tolist()):
            out[w] = v
    return out


def fill_runledger(folder: str, n: int, q) -> None:
    """The --query run through the ledger's own writer: a `metrics` event per step, sealed and hash-chained,
    into Parquet (runledger.ledger.emit.sink.ParquetSink, as the ledger stores them)."""
    from runledger.ledger.emit.sink import ParquetSink

    t = time.time()
    with ParquetSink(folder, RUN_ID) as sink:
        for steps, values in query_chunks(n):
            sink.emit_dicts("metrics", [{"metrics": dict(zip(FREE_NAMES, row))} for row in values.tolist()], steps.tolist())
    q.put(("runledger", {"root": folder, "run_id": RUN_ID, "fill_s": time.time() - t}))


def fill_mlflow(folder: str, n: int, q) -> None:
    """The --query run in MLflow's sqlite store: MLflow creates it and logs step 0; the other steps are rows
    of its `metrics` table, in the order log_metrics writes them, and `latest_metrics` is moved on."""
    import mlflow

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    db = os.path.join(folder, "mlflow.db")
    chunks = query_chunks(n)
    steps, values = next(chunks)
    t = time.time()
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    mlflow.set_experiment("peers")
    with mlflow.start_run() as run:
        mlflow.log_metrics(dict(zip(FREE_NAMES, values[0].tolist())), step=int(steps[0]))
    run_uuid = run.info.run_id
    con = sqlite3.connect(db)
    (t0,), = con.execute("select min(timestamp) from metrics").fetchall()
    con.execute("pragma synchronous = off")  # the fill's speed; the file is the same

    def write(steps, values) -> None:
        with con:
            con.executemany("insert into metrics (key, value, timestamp, run_uuid, step, is_nan) values (?, ?, ?, ?, ?, 0)",
                            [(k, v, t0 + s * STEP_MS, run_uuid, s) for s, row in zip(steps.tolist(), values.tolist())
                             for k, v in zip(FREE_NAMES, row)])

    for steps, values in itertools.chain([(steps[1:], values[1:])], chunks):  # (step 0 is MLflow's own)
        write(steps, values)
    last_step, last = int(steps[-1]), values[-1].tolist()
    with con:
        con.executemany("update latest_metrics set value = ?, timestamp = ?, step = ? where run_uuid = ? and key = ?",
                        [(v, t0 + last_step * STEP_MS, last_step, run_uuid, k) for k, v in zip(FREE_NAMES, last)])
    con.close()
    q.put(("mlflow", {"db": db, "run_id": run_uuid, "fill_s": time.time() - t}))


def fill_trackio(folder: str, n: int, q) -> None:
    """The --query run in Trackio's sqlite store: Trackio creates it and logs step 0; the other steps are rows
    of its `metrics` table as its writer inserts them (timestamp, run, step, the dict as JSON, a log_id)."""
    from datetime import datetime, timedelta
    import uuid

    os.environ.update(TRACKIO_DIR=folder, TRACKIO_STORAGE_MODE="sqlite", HF_HUB_OFFLINE="1")
    import orjson
    import trackio
    from trackio.sqlite_storage import SQLiteStorage

    chunks = query_chunks(n)
    steps, values = next(chunks)
    t = time.time()
    run = trackio.init(project="peers", name=RUN_ID, embed=False, auto_log_gpu=False, auto_log_cpu=False)
    trackio.log(dict(zip(FREE_NAMES, values[0].tolist())), step=int(steps[0]))
    trackio.finish()
    db = str(SQLiteStorage.get_project_db_path("peers"))
    con = sqlite3.connect(db)
    (t0,), = con.execute("select min(timestamp) from metrics").fetchall()
    t0 = datetime.fromisoformat(t0)
    con.execute("pragma synchronous = off")

    def write(steps, values) -> None:
        with con:
            con.executemany("insert into metrics (timestamp, run_id, run_name, step, metrics, log_id, space_id) "
                            "values (?, ?, ?, ?, ?, ?, null)",
                            [((t0 + timedelta(milliseconds=s * STEP_MS)).isoformat(), run.id, run.name, s,
                              orjson.dumps(dict(zip(FREE_NAMES, row))), uuid.uuid4().hex)
                             for s, row in zip(steps.tolist(), values.tolist())])

    for steps, values in itertools.chain([(steps[1:], values[1:])], chunks):  # (step 0 is Trackio's own)
        write(steps, values)
    con.close()
    q.put(("trackio", {"db": db, "run_id": run.id, "fill_s": time.time() - t}))


FILLS = {"runledger": fill_runledger, "mlflow": fill_mlflow, "trackio": fill_trackio}
QUERY_IMPORTS = {"runledger": ["queries", "duckdb"], "runledger-col": ["queries", "duckdb"], "mlflow": ["sqlite3"],
                 "trackio": ["sqlite3"]}


@dataclass
class Timed:
    open_s: float
    cold_s: float  # open + the first query
    warm_s: float  # median of QUERY_REPS, store open
    differs: str  # '' when the answer is the truth


def ask_store(name: str, where: dict, truth: dict[int, float], q) -> None:
    """A fresh process asks one store (so that cold is cold for each, whatever was asked before)."""
    q.put((name, vars(time_window_max(name, where, truth))))


def time_window_max(name: str, where: dict, truth: dict[int, float]) -> Timed:
    """Open the store and ask for the max of QUERY_KEY per WINDOW steps, cold then warm; imports before any clock."""
    import importlib

    for module in QUERY_IMPORTS[name]:
        importlib.import_module(module)
    perf = time.perf_counter
    t0 = perf()
    store = STORES[name](where)
    t1 = perf()
    got = store.window_max(QUERY_KEY)
    t2 = perf()
    warm = []
    for _ in range(QUERY_REPS):
        t = perf()
        store.window_max(QUERY_KEY)
        warm.append(perf() - t)
    differs = ""
    if sorted(got) != sorted(truth):
        differs = f"{len(got)} windows != {len(truth)}"
    else:
        bad = [w for w, v in truth.items() if not math.isclose(got[w], v, rel_tol=1e-12)]
        differs = f"window {bad[0]}: {got[bad[0]]} != {truth[bad[0]]}" if bad else ""
    return Timed(t1 - t0, t2 - t0, statistics.median(warm), differs)


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def bench_query(ctx, tmp: Path, n: int, only: list[str]) -> int:
    """Issue 16's query: the max of one name per WINDOW steps of an n-step x 20-name run, from each store."""
    truth = query_truth(n)
    filled: dict[str, dict] = {}
    timed: dict[str, Timed] = {}
    errors: dict[str, str] = {}
    for name in only:
        log.info("writing %d steps x %d names into %s", n, len(FREE_NAMES), name)
        try:
            (tmp / name).mkdir(parents=True)
            filled[name] = _child(ctx, FILLS[name], (str(tmp / name), n))
            filled[name]["bytes"] = _size(tmp / name)
        except Exception as err:  # a peer that cannot run here is reported, the others go on
            errors[name] = f"{type(err).__name__}: {err}"
            log.exception("%s failed", name)
    if "runledger" in filled:  # the same store, asked through a name's own column
        filled = {"runledger": filled["runledger"], "runledger-col": filled["runledger"], **filled}
    for name in filled:
        log.info("asking %s", name)
        try:
            timed[name] = Timed(**_child(ctx, ask_store, (name, filled[name], truth)))
        except Exception as err:
            errors[name] = f"{type(err).__name__}: {err}"
            log.exception("querying %s failed", name)
    names = list(filled)
    print()
    print(f"{n} steps x {len(FREE_NAMES)} names, one run; max of {QUERY_KEY} per {WINDOW} steps ({len(truth)} windows), "
          f"SQL on each store; {os.cpu_count()} CPUs")
    print(f"cells: value (peer/runledger; above 1 = runledger faster); warm = median of {QUERY_REPS}; "
          "cold = open + first query in a fresh process, page cache warm; runledger = the `metrics` view, "
          "runledger-col = `metric(name)`, the name's own column")
    _print_rows(names, [
        ("fill: library run + bulk write [s]", 1, lambda x: filled[x]["fill_s"], False),
        ("store on disk [MB]", 1e-6, lambda x: filled[x]["bytes"], False),
        ("open [ms]", 1e3, lambda x: timed[x].open_s if x in timed else None, True),
        ("cold: open + query [ms]", 1e3, lambda x: timed[x].cold_s if x in timed else None, True),
        ("warm query [ms]", 1e3, lambda x: timed[x].warm_s if x in timed else None, True),
    ], ratio=lambda rl, v: v / rl)
    print(f"{'answer is the truth':<38}" + "".join(
        f"{('yes' if not timed[x].differs else 'NO') if x in timed else 'n/a':>22}" for x in names))
    for x in names:
        if x in timed and timed[x].differs:
            print(f"  {x}: {timed[x].differs}")
    for x, e in errors.items():
        print(f"  {x} could not run: {e}")
    for ours in ("runledger", "runledger-col"):
        if ours not in timed:
            continue
        rl = timed[ours]
        for x in (x for x in names if not x.startswith("runledger") and x in timed):
            warm, cold = timed[x].warm_s / rl.warm_s, timed[x].cold_s / rl.cold_s
            print(f"targets: {ours} query >= 10x faster than {x} (SQL on its sqlite): warm {warm:.1f}x, cold {cold:.1f}x -> " +
                  ("met" if min(warm, cold) >= 10 else "MISSED"))
    return 1 if errors or any(t.differs for t in timed.values()) else 0


# ------------------------------------------------------------------------------ the free-form path (--freeform)


def _stop_local(name: str, root: Path) -> None:
    """Stop the local server runledger.init started for `root` (else it stops RUNLEDGER_IDLE_S after its last client)."""
    if name == "runledger" and root.exists():
        from runledger.ledger import local

        local.down(root)


def _wait_gone(pids: list[int], timeout: float = 30.0) -> list[int]:
    """Wait for a crashed peer's helper processes (W&B's wandb-core) to exit; end those left."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in alive:
        proc.kill()
    return [proc.pid for proc in alive]


def _settled(name: str, where: dict, n: int, quiet_s: float = SETTLE_S, timeout: float = 300.0) -> tuple[int, float]:
    """After a crash: the steps a peer's store holds once it stops changing for `quiet_s` (runledger's local
    supervisor, a process of its own, sends what a dead producer left in its spool), and how long that took."""
    t0 = time.monotonic()
    last, changed = -1, t0
    while True:
        try:
            got = _steps_stored(name, where)
        except Exception as err:  # a read racing the writer (runledger: a file the ledger's compaction replaced)
            log.warning("%s: counting after the crash failed (%s: %s); counting again", name, type(err).__name__, err)
            got = last
        now = time.monotonic()
        if got != last:
            last, changed = got, now
        if got == n or now - changed >= quiet_s or now - t0 > timeout:
            return got, changed - t0
        time.sleep(0.25)


def _steps_stored(name: str, where: dict) -> int:
    """Steps with every free-form name in a peer's store; 0 when its file was never created (nothing written)."""
    if "db" in where and not os.path.exists(where["db"]):
        return 0
    store = STORES[name](where)
    return min(store.stored(k) for k in FREE_NAMES)


def bench_freeform(ctx, tmp: Path, n: int, step_ms: float, only: list[str]) -> int:
    """Issue 16's free-form path: each peer logs the same n steps x 20 names; then once more, crashing at the loop's end."""
    step_s = step_ms / 1000
    logged: dict[str, Logged] = {}
    stored: dict[str, int] = {}  # steps with every name in the store after finish
    kept: dict[str, tuple[int, float]] = {}  # ... after a crash at the loop's end, and when they were there
    errors: dict[str, str] = {}
    t_all = time.time()
    for name in only:
        try:
            log.info("logging %d steps x %d names through %s", n, len(FREE_NAMES), name)
            logged[name] = lg = _run(ctx, name, tmp / name, n, step_s, "free")
            if name == "runledger":  # queryable: the `metrics` view has every row
                t = time.perf_counter()
                rows = RunledgerStore(lg.where).rows()
                lg.where["count_s"] = time.perf_counter() - t
                assert rows == n * len(FREE_NAMES), f"runledger: {rows} rows, expected {n * len(FREE_NAMES)}"
            stored[name] = _steps_stored(name, lg.where)
            _stop_local(name, tmp / name)
            log.info("logging %d steps through %s, crashing at the loop's end", n, name)
            crashed = _run(ctx, name, tmp / f"{name}-crash", n, step_s, "free", crash=True)
            helpers = crashed.where.pop("helpers")
            kept[name] = _settled(name, crashed.where, n)
            _stop_local(name, tmp / f"{name}-crash")
            if left := _wait_gone(helpers):
                log.warning("%s: helper processes %s still running after the crash, ended", name, left)
        except Exception as err:  # a peer that cannot run here is reported, the others go on
            errors[name] = f"{type(err).__name__}: {err}"
            log.exception("%s failed", name)
            for folder in (tmp / name, tmp / f"{name}-crash"):
                _stop_local(name, folder)
    names = [x for x in only if x in logged]
    print()
    print(f"{n} steps x {len(FREE_NAMES)} free-form names (runledger: runledger.log; the peers' own calls); "
          f"simulated device time {step_ms} ms/step; {os.cpu_count()} CPUs; whole bench {time.time() - t_all:.0f} s")
    print("cells: value (runledger/peer; below 1 = runledger faster); runledger durable = run.finish() returned, "
          "+ queryable = the `metrics` view counts every row")
    _print_rows(names, [
        ("setup (create logger) [s]", 1, lambda x: logged[x].setup_s, True),
        ("loop overhead / step [us]", 1e6, lambda x: logged[x].log_s / n, True),
        ("loop end -> durable (+queryable) [s]", 1, lambda x: _ttq(logged[x]), True),
        ("first log -> durable (+queryable) [s]", 1, lambda x: _total(logged[x]), True),
        ("steps stored after finish", 1, lambda x: stored.get(x), False),
        ("steps stored after a crash at loop end", 1, lambda x: kept[x][0] if x in kept else None, False),
        ("  crash -> that many stored [s]", 1, lambda x: kept[x][1] if x in kept else None, False),
    ])
    for x, e in errors.items():
        print(f"  {x} could not run: {e}")
    if "runledger" in logged:
        rl = logged["runledger"].log_s
        ov = {x: logged[x].log_s for x in names if x != "runledger"}
        print("targets: per-step overhead below every peer: " +
              ("met" if ov and all(rl < v for v in ov.values()) else "MISSED") +
              (f" (max ratio {max(rl / v for v in ov.values()):.2f})" if ov else ""))
        got = kept.get("runledger", (None, 0.0))[0]
        print(f"targets: what log accepted is kept after a crash: runledger kept {got} of {n} steps -> " +
              ("met" if got == n else "MISSED"))
    incomplete = [x for x in names if stored.get(x) != n]
    for x in incomplete:
        print(f"  {x}: {stored.get(x)} of {n} steps stored after finish")
    return 1 if errors or incomplete else 0


# ------------------------------------------------------------------------------ main


def _ttq(lg: Logged) -> float:  # loop end → durable and queryable
    return lg.durable_at - lg.loop_end + lg.where.get("count_s", 0.0)


def _total(lg: Logged) -> float:  # first log call → durable and queryable
    return lg.durable_at - lg.loop_start + lg.where.get("count_s", 0.0)


def _print_rows(names: list[str], rows: list, ratio=lambda rl, v: rl / v, width: int = 22) -> None:
    """A table of (label, unit scale, value of a peer or None, compare with runledger?) rows, a column per peer;
    a compared cell says `ratio(runledger's value, the peer's)` in parentheses."""
    print(f"{'measure':<38}" + "".join(f"{x:>{width}}" for x in names))
    for label, scale, get, compare in rows:
        cells = []
        rl = get("runledger") if "runledger" in names else None
        for x in names:
            v = get(x)
            if v is None:
                cells.append(f"{'-':>{width}}")
                continue
            txt = f"{v}" if isinstance(v, int) and scale == 1 else f"{v * scale:.4g}"
            if compare and not x.startswith("runledger") and rl is not None:
                txt += f" ({ratio(rl, v) if v and rl else float('inf'):.3g})"
            cells.append(f"{txt:>{width}}")
        print(f"{label:<38}" + "".join(cells))


def main() -> int:
    p = argparse.ArgumentParser(description="runledger vs MLflow, W&B offline, TensorBoard and Trackio: the same metrics, one run")
    p.add_argument("--steps", type=int, default=5_000, help="training steps to log (default 5,000: about 3 minutes here)")
    p.add_argument("--large", action="store_true", help="50,000 steps (tens of minutes: MLflow is the slow one)")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="simulated device time per step, GIL released (default 0: a tight loop, the worst case "
                        "for loggers that work in a background thread of the training process)")
    p.add_argument("--freeform", action="store_true",
                   help="issue 16: runledger.log against the peers' free-form calls, 20 names a step, "
                        "and a crash at the loop's end")
    p.add_argument("--query", action="store_true",
                   help=f"issue 16: the max of one name per {WINDOW} steps from a --query-steps x 20-name run "
                        f"in runledger, MLflow and Trackio (SQL)")
    p.add_argument("--query-steps", type=int, default=QUERY_STEPS,
                   help=f"steps of the --query run, a multiple of {QUERY_CHUNK} (default 1,000,000: minutes per store)")
    p.add_argument("--only", default=None,
                   help=f"comma-separated subset of {','.join(PEERS)} (default: all but mlflow-sync; "
                        f"with --query: {','.join(QUERY_PEERS)})")
    p.add_argument("--keep", action="store_true", help="keep the stores (their folder is printed)")
    args = p.parse_args()
    if args.query and args.query_steps % QUERY_CHUNK:
        p.error(f"--query-steps must be a multiple of {QUERY_CHUNK}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("tensorboard").setLevel(logging.WARNING)  # "No path found after ...": the file was read whole
    n = 50_000 if args.large else args.steps
    chosen = args.only.split(",") if args.only else QUERY_PEERS if args.query else DEFAULT_PEERS
    only = [x for x in (QUERY_PEERS if args.query else PEERS) if x in chosen]
    tmp = Path(tempfile.mkdtemp(prefix="rl-bench-peers-"))
    ctx = mp.get_context("spawn")  # every peer in a fresh interpreter: no shared imports, threads or state
    try:
        if args.query:
            return bench_query(ctx, tmp, args.query_steps, only)
        if args.freeform:
            return bench_freeform(ctx, tmp, n, args.step_ms, only)
        return bench_steps(ctx, tmp, n, args.step_ms, only)
    finally:
        if args.keep:
            print(f"stores kept under {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def bench_steps(ctx, tmp: Path, n: int, step_ms: float, only: list[str]) -> int:
    """The 13 numbers of a training step (issue 8): runledger's Emitter → NATS → ledger against the peers."""
    step_s = step_ms / 1000
    truth = truth_of(make_steps(n))
    logged: dict[str, Logged] = {}
    queried: dict[str, Queried] = {}
    errors: dict[str, str] = {}
    t_all = time.time()
    for name in only:
        log.info("logging %d steps through %s", n, name)
        try:
            if name == "runledger":
                logged[name] = run_runledger(ctx, tmp / name, n, step_s)
            else:
                logged[name] = _run(ctx, name, tmp / name, n, step_s, "step")
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
    if "runledger" in logged:
        t = time.perf_counter()
        got = RunledgerStore(logged["runledger"].where).count()
        logged["runledger"].where["count_s"] = time.perf_counter() - t
        assert got == 2 * n, f"runledger: {got} rows, expected {2 * n}"
    print_table(n, step_ms, truth, logged, queried, errors, time.time() - t_all)
    return 1 if errors or any(q.differs for q in queried.values()) else 0


def print_table(n: int, step_ms: float, truth: Answers, logged: dict[str, Logged], queried: dict[str, Queried],
                errors: dict[str, str], wall: float) -> None:
    names = [x for x in ("runledger", "mlflow", "mlflow-api", "mlflow-sync", "wandb", "tensorboard", "trackio")
             if x in queried or x in logged]
    rl_l, rl_q = logged.get("runledger"), queried.get("runledger")

    def lg(x: str) -> Logged | None:  # mlflow-api is mlflow's run, asked another way
        return logged[x] if x in logged and x != "mlflow-api" else None

    rows = [  # (label, unit scale, value of a peer or None, compared)
        ("setup (create logger) [s]", 1, lambda x: lg(x).setup_s if lg(x) else None, True),
        ("loop overhead / step [us]", 1e6, lambda x: lg(x).log_s / n if lg(x) else None, True),
        ("loop end -> durable+queryable [s]", 1, lambda x: _ttq(lg(x)) if lg(x) else None, True),
        ("first log -> durable+queryable [s]", 1, lambda x: _total(lg(x)) if lg(x) else None, True),
        ("open store [ms]", 1e3, lambda x: queried[x].open_s if x in queried else None, True),
        (f"Q1 max grad_norm / {WINDOW} steps [ms]", 1e3, lambda x: queried[x].q1_s if x in queried else None, True),
        (f"Q2 steps drop_fraction > {DROP_ALERT} [ms]", 1e3, lambda x: queried[x].q2_s if x in queried else None, True),
        ("cold: open + Q1 + Q2 [ms]", 1e3, lambda x: queried[x].cold_s if x in queried else None, True),
    ]
    print()
    print(f"{n} steps x 13 metrics (runledger: {2 * n} events, `step` + `drops` with per-layer counts); "
          f"simulated device time {step_ms} ms/step; {os.cpu_count()} CPUs; whole bench {wall:.0f} s")
    print(f"truth: {len(truth.max_grad_norm)} windows, {len(truth.high_drop_steps)} steps with drop_fraction > {DROP_ALERT}")
    print("cells: value (runledger/peer; below 1 = runledger faster). mlflow = async log_metrics, queried with SQL on "
          "its sqlite; mlflow-api = the same run through MlflowClient.get_metric_history; mlflow-sync = synchronous "
          "log_metrics; trackio = SQL (json_extract) on its sqlite")
    width = 22
    _print_rows(names, rows, width=width)
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
        for m in ("mlflow", "mlflow-api", "trackio"):
            if m in queried:
                r1, r2 = queried[m].q1_s / rl_q.q1_s, queried[m].q2_s / rl_q.q2_s
                rc = queried[m].cold_s / rl_q.cold_s
                print(f"targets: query >= 10x faster than {m}: Q1 {r1:.1f}x, Q2 {r2:.1f}x, cold {rc:.1f}x -> " +
                      ("met" if min(r1, r2) >= 10 else "MISSED"))


if __name__ == "__main__":
    raise SystemExit(main())
