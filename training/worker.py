"""The training worker: a pure jitted `train_step(state, batch) -> (state, metrics)` and a thin
loop around it that times each step, checkpoints, evaluates and emits the run's events.

Typed events go into an `EventSink` (runledger.ledger.emit.sink: the NATS Emitter, a list in tests, a NullSink
when nothing is recorded): `run_started` and `data` once per attempt, `step` and `drops` every step,
`eval` every `eval_every` steps, `checkpoint` every `ckpt_every` steps and at the end, `run_finished`.
Steps are 1-based: step k is the k-th update; it trains on `batch_at(seed, k)`, so a run resumed
from the checkpoint of step k continues exactly as if it had never stopped.
A non-finite loss or gradient never crashes the run: that update is skipped (params and optimizer
state unchanged) and the step is recorded with loss None and skipped True. Each `step` carries the
sequence length it trained at and the FLOPs per token at that length (its MFU's numerator), so MFU
follows a context extension and the audit can recompute it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from runledger.ledger.emit.emitter import Emitter, origin
from runledger.ledger.emit.heartbeat import Heartbeat
from runledger.ledger.contract.events import (CheckpointSaved, DataRecorded, DecisionApplied, EvalCompleted, RunFinished, RunStarted)
from runledger.ledger.emit.sink import EventSink, NullSink
from runledger.training import checkpoint, data
from runledger.training.config import TrainConfig, config_hash
from runledger.training.decisions import apply_decision, dispatch_fields, with_dispatch
from runledger.training.flops import flops_per_token, measure_peak_flops
from runledger.training.model import loss_fn, token_losses
from runledger.training.moe import AXIS
from runledger.training.record import code_commit, hardware, step_completed, tokens_dropped
from runledger.training.schedule import lr_at, make_schedule

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Start:
    """Where an attempt starts: fresh (the defaults), resumed, or forked from a parent checkpoint."""

    attempt: int = 0
    checkpoint_path: str | None = None
    step: int = 0
    schedule: dict | None = None  # the schedule in force (None: the config's own)
    content_hash: str | None = None  # expected hash of the checkpoint (checked on restore)
    parent: dict | None = None  # fork: {"run_id", "step", "content_hash", "path"}
    dispatch: dict | None = None  # dispatch mode / capacity factors in force (decisions replayed)
    # the context extension's hold as the attempts before applied it, (step, held) in order (decisions replayed):
    # a resumed attempt holds and releases it at the steps its past did, so that it redoes their updates at the
    # same length (those decisions are answered, and never handed to it again)
    extension_holds: tuple[tuple[int, bool], ...] = ()


@dataclass
class TrainResult:
    state: Any
    losses: dict[int, float | None] = field(default_factory=dict)
    final_step: int = 0
    tokens_seen: int = 0
    status: str = "completed"
    checkpoints: list[dict] = field(default_factory=list)
    drops: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # step -> per layer (sender, receiver)
    evals: dict[int, float] = field(default_factory=dict)  # step -> held-out loss


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    o = cfg.optim

    def build(learning_rate):
        return optax.chain(optax.clip_by_global_norm(o.clip_norm),
                           optax.adamw(learning_rate, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay))

    return optax.inject_hyperparams(build)(learning_rate=o.peak_lr)


def init_state(cfg: TrainConfig) -> dict:
    from runledger.training.model import init_params

    params = init_params(cfg.seed, cfg)
    return {"params": params, "opt_state": make_optimizer(cfg).init(params), "step": jnp.zeros((), jnp.int32)}


def with_lr(state: dict, lr: float) -> dict:
    """The state with the optimizer's injected learning rate set (same shape: no recompile)."""
    opt_state = state["opt_state"]
    hp = dict(opt_state.hyperparams, learning_rate=jnp.asarray(lr, jnp.float32))
    return {**state, "opt_state": opt_state._replace(hyperparams=hp)}


def lr_in_force(state: dict) -> float:
    return float(state["opt_state"].hyperparams["learning_rate"])


def make_mesh(cfg: TrainConfig):
    """A 1-D expert-parallel mesh over S devices when this process has them, else None (simulated)."""
    S = cfg.moe.shards
    if S > 1 and jax.device_count() >= S:
        return jax.sharding.Mesh(np.array(jax.devices()[:S]), (AXIS,))
    return None


def _step_key(cfg: TrainConfig) -> TrainConfig:
    """The part of a config the update depends on (steps, eval and checkpoint cadence do not)."""
    return TrainConfig(model=cfg.model, moe=cfg.moe, optim=cfg.optim, logit_z_coef=cfg.logit_z_coef)


def make_train_step(cfg: TrainConfig, mesh=None) -> Callable:
    """The pure, jitted update for this config (cached, so a process compiles it once)."""
    return _make_train_step(_step_key(cfg), mesh)


@functools.lru_cache(maxsize=16)
def _make_train_step(cfg: TrainConfig, mesh=None) -> Callable:
    opt = make_optimizer(cfg)

    def train_step(state, batch):
        params, opt_state = state["params"], state["opt_state"]
        (total, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, cfg, mesh)
        total = jnp.where(batch["poison"] > 0, jnp.nan, total)  # fault injection (chaos tests)
        grad_norm = optax.tree.norm(grads)
        ok = jnp.isfinite(total) & jnp.isfinite(grad_norm)
        updates, new_opt = opt.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        keep = functools.partial(jax.tree.map, lambda new, old: jnp.where(ok, new, old))
        params, opt_state = keep(new_params, params), keep(new_opt, opt_state)
        layers = aux["layers"]
        metrics = {
            "loss": aux["ce"], "total_loss": total, "grad_norm": grad_norm,
            "param_norm": optax.tree.norm(params), "lr": state["opt_state"].hyperparams["learning_rate"],
            "z_loss": aux["z_loss"], "lb_loss": aux["lb_loss"], "logit_z": aux["logit_z"],
            "router_entropy": jnp.mean(layers["entropy"]), "skipped": ~ok,
            "layers": {k: layers[k] for k in ("sender_dropped", "receiver_dropped", "assignments", "loads", "entropy")},
        }
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

    return jax.jit(train_step)


PROBE_LEAD = 12  # steps before a context extension that drops are probed at the longer length
PROBE_EVERY = 2


def make_probe(cfg: TrainConfig, mesh=None) -> Callable:
    """Forward only: the per-layer drop accounting of a batch (for probes at another length)."""
    return _make_probe(_step_key(cfg), mesh)


@functools.lru_cache(maxsize=8)
def _make_probe(cfg: TrainConfig, mesh=None) -> Callable:
    keys = ("sender_dropped", "receiver_dropped", "assignments", "loads", "entropy")
    return jax.jit(lambda params, b: {k: loss_fn(params, b, cfg, mesh)[1]["layers"][k] for k in keys})


def make_eval_step(cfg: TrainConfig, mesh=None) -> Callable:
    return _make_eval_step(_step_key(cfg), mesh)


@functools.lru_cache(maxsize=16)
def _make_eval_step(cfg: TrainConfig, mesh=None) -> Callable:
    return jax.jit(lambda params, b: token_losses(params, b["inputs"], b["targets"], cfg, mesh))


def evaluate(params, cfg: TrainConfig, heldout: dict, mesh=None) -> EvalCompleted:
    """Held-out loss per domain (and their mean): the `eval` event."""
    fn = make_eval_step(cfg, mesh)
    losses, tokens = {}, 0
    for name, batches in heldout.items():
        per_seq = [np.asarray(fn(params, b)) for b in batches]
        losses[name] = float(np.mean(np.concatenate(per_seq)))
        tokens += sum(b["targets"].size for b in batches)
    return EvalCompleted(loss=float(np.mean(list(losses.values()))), domain_losses=losses, tokens=tokens)


def attester_for(sink: EventSink, attest: bool, root: str | Path | None, run_id: str, attempt: int,
                 sources: list[dict]):
    """The run's Attester (runledger.ledger.attest), or None: off, or the `[attest]` extra missing (said once)."""
    if not attest:
        return None
    from runledger.ledger import attest as attesting

    why = attesting.unavailable()
    if why is not None:
        log.info("%s: checkpoints are not attested: %s", run_id, why)
        return None
    producer = sink.producer if isinstance(sink.producer, str) else None
    try:
        return attesting.Attester(sink, root=Path(root) if root is not None else None,
                                  run={"run_id": run_id, "producer": producer, "attempt": attempt},
                                  data_sources=sources, code_commit=code_commit())
    except (OSError, ValueError) as err:  # (its key unreadable, or readable by others: said, and training goes on)
        log.error("%s: checkpoints are not attested: %s", run_id, err)
        return None


def train(cfg: TrainConfig, *, run_id: str, ckpt_dir: str | Path, sink: EventSink = NullSink(), start: Start = Start(),
          steps: int | None = None, preset: str | None = None, mesh=None, peak_flops: float | None = None,
          nan_steps: frozenset[int] = frozenset(), should_stop: Callable[[], bool] | None = None,
          decisions: Callable[[int], list[dict]] | None = None, planned_tokens_per_s: float | None = None,
          thresholds: dict | None = None, slow: tuple[int, float] | None = None,
          extend: tuple[int, int] | None = None, attest: bool = True, tlog_root: str | Path | None = None) -> TrainResult:
    """Run (or resume, or fork) a run up to step `steps` (default: the schedule's horizon in force).

    `decisions(step)` (optional) returns the decisions to carry out before the next update; see
    `runledger.training.decisions`. Each is answered with a `decision_applied` event. `planned_tokens_per_s`
    overrides the plan derived from `planned_mfu`; `thresholds` (agents' and audits' overrides) go
    into `run_started`; `slow=(until_step, seconds)` is fault injection: each update up to that step
    takes that much longer (a slow node), inside the timed step. `extend=(at_step, seq_len)` schedules
    a context extension (same tokens per step, longer sequences): for PROBE_LEAD steps before it,
    every PROBE_EVERY steps, drops are measured at the longer length and recorded as `drops` events
    with probe=True; a `hold_context_extension` decision holds it (probing goes on) until a
    `release_context_extension` decision releases it. `attest`: each checkpoint saved is attested in the
    background (`runledger.ledger.attest`: signed, its provenance statement's digest an `attestation` event)
    when the `[attest]` extra is installed; `tlog_root` is the ledger root whose signed log checkpoint the
    statements name.
    """
    emit = sink.emit
    cfg = with_dispatch(cfg, start.dispatch or {})
    T, L = cfg.tokens_per_step, cfg.model.seq_len
    schedule = start.schedule or make_schedule(cfg.optim.peak_lr, cfg.optim.warmup_steps, cfg.steps,
                                               cfg.optim.min_lr_ratio, tokens_per_step=T)
    corpus = data.load_corpus(cfg.data)
    mixture = cfg.data.mixture_dict()
    state = init_state(cfg)
    resumed_from = None
    if start.checkpoint_path:
        state = checkpoint.restore(start.checkpoint_path, state, start.content_hash)
        resumed_from = {"path": str(start.checkpoint_path), "step": int(state["step"]),
                        "content_hash": checkpoint.content_hash(state)}
        log.info("restored step %d from %s", int(state["step"]), start.checkpoint_path)
    first = int(state["step"]) + 1
    last = steps if steps is not None else int(schedule["horizon_steps"])  # the horizon in force
    peak = peak_flops if peak_flops is not None else measure_peak_flops()
    fpt = flops_per_token(cfg)  # at the length trained now; a context extension recomputes it
    chash = config_hash(cfg)
    if extend is not None:
        schedule = {**schedule, "context_extension": {"at_step": int(extend[0]), "seq_len": int(extend[1])}}
    producer = sink.producer  # who emits: name, host and pid (issue 22: names may clash)
    who = {"origin": origin(producer)} if isinstance(producer, str) else {}
    beat = Heartbeat(sink) if isinstance(sink, Emitter) else None  # a live worker says so (a list in tests need not)
    emit(RunStarted(
        config=cfg.to_dict(), config_hash=chash, code_commit=code_commit(), preset=preset,
        token_budget=int(schedule["horizon_steps"]) * T, tokens_per_step=T, schedule=schedule,
        data_mixture=mixture,
        planned_tokens_per_s=planned_tokens_per_s or cfg.planned_mfu * peak / fpt,
        thresholds={k: float(v) for k, v in (thresholds or {}).items()},
        hardware={**hardware(mesh), **who}, heartbeat_s=beat.interval if beat else None, peak_flops=peak, flops_per_token=fpt,
        resumed_from=None if start.parent else resumed_from, parent=start.parent,
    ), step=first - 1)
    provenance = data.provenance(corpus, mixture, cfg.seed, cfg.batch_size, L, max(last - first + 1, 0))
    emit(DataRecorded.model_validate(provenance), step=first - 1)
    attester = attester_for(sink, attest, tlog_root, run_id, start.attempt, provenance["sources"])

    heldout = data.heldout_batches(corpus, cfg.seed, cfg.batch_size, L, cfg.eval_batches)
    result = TrainResult(state=state, final_step=first - 1, tokens_seen=(first - 1) * T)

    def compiled(c: TrainConfig):
        t = time.perf_counter()
        warm = {**data.batch_at(corpus, mixture, c.seed, first, c.batch_size, L), "poison": np.float32(0)}
        fn = make_train_step(c, mesh).lower(with_lr(state, 0.0), warm).compile()
        log.info("%s: compiled the train step (%s) in %.1fs", run_id, c.moe.dispatch, time.perf_counter() - t)
        return fn

    def save(k: int, reason: str) -> None:
        if attester is not None and checkpoint.step_dir(ckpt_dir, k).exists():
            attester.wait()  # (a folder saved again: its attestation first)
        info = checkpoint.save(ckpt_dir, k, state, {"run_id": run_id, "config_hash": chash, "schedule": schedule,
                                                    "dispatch": dispatch_fields(cfg), "tokens_seen": k * T,
                                                    "attempt": start.attempt})
        result.checkpoints.append(info)
        emit(CheckpointSaved(path=info["path"], bytes=info["bytes"], seconds=info["seconds"],
                             content_hash=info["content_hash"], config_hash=chash, tokens_seen=k * T,
                             reason=reason), step=k)
        if attester is not None:
            attester.submit(info["path"], k, config=cfg.to_dict(), config_hash=config_hash(cfg),
                            content_hash=info["content_hash"], tokens_seen=k * T)

    def roll_back(d: dict, k: int) -> tuple[int, dict]:
        """A rollback decision: restore the checkpoint at or before params.to_step; the next update."""
        nonlocal state
        to = int((d.get("params") or {}).get("to_step", k - 1))
        meta = checkpoint.latest(ckpt_dir, at_or_before=to)
        base = {"decision_id": d["decision_id"], "action": "rollback"}
        if meta is None:
            return k, {**base, "status": "refused", "reason": f"no checkpoint at or before step {to}"}
        state = checkpoint.restore(meta["path"], state, meta["content_hash"])
        return int(meta["step"]) + 1, {**base, "status": "applied", "before": {"step": k - 1},
                                       "after": {"step": int(meta["step"]), "checkpoint": meta["path"],
                                                 "content_hash": meta["content_hash"]}}

    replayed = dict(start.extension_holds)  # step -> held from then on (the latest at a step wins)
    held = {"now": next((h for st, h in reversed(start.extension_holds) if st < first), False)}

    def carry_out(k: int) -> int:
        """Decisions between update k-1 and update k; returns the next update (a rollback moves it)."""
        nonlocal cfg, schedule, last, train_step
        for d in decisions(k - 1):
            if d["action"] in ("hold_context_extension", "release_context_extension"):
                ext = schedule.get("context_extension")
                hold = d["action"] == "hold_context_extension"
                base = {"decision_id": d["decision_id"], "action": d["action"]}
                if ext is None or ext.get("done"):
                    applied = {**base, "status": "refused", "reason": "no context extension is scheduled ahead"}
                else:
                    applied = {**base, "status": "applied", "before": {"held": held["now"]}, "after": {"held": hold}}
                    held["now"] = hold
                log.info("%s: decision %s (%s) %s before step %d", run_id, d["decision_id"], d["action"], applied["status"], k)
                emit(DecisionApplied.model_validate(applied), step=k - 1)
                continue
            if d["action"] == "rollback":
                k_next, applied = roll_back(d, k)
                log.info("%s: decision %s (rollback) %s: next update %d", run_id, d["decision_id"], applied["status"], k_next)
                emit(DecisionApplied.model_validate(applied), step=k - 1)
                k = k_next
                continue
            new_cfg, schedule, applied, wants_checkpoint = apply_decision(d, k, cfg, schedule)
            if steps is None:
                last = int(schedule["horizon_steps"])
            if new_cfg != cfg:
                cfg, train_step = new_cfg, compiled(new_cfg)
            log.info("%s: decision %s (%s) %s before step %d", run_id, d["decision_id"], d["action"],
                     applied["status"], k)
            emit(DecisionApplied.model_validate(applied), step=k - 1)
            if wants_checkpoint and k - 1 >= first:
                save(k - 1, "requested")
        return k

    def long_cfg(c: TrainConfig) -> TrainConfig:
        ext = schedule["context_extension"]
        long_len = ext["seq_len"]
        return dataclasses.replace(c, model=dataclasses.replace(c.model, seq_len=long_len),
                                   batch_size=max(c.batch_size * c.model.seq_len // long_len, 1))

    def probe(k: int) -> None:
        """Drops at the longer length, same tokens per batch, no update: what the extension would meet."""
        c = long_cfg(cfg)
        b = data.batch_at(corpus, mixture, c.seed, k, c.batch_size, c.model.seq_len)
        layers = jax.device_get(make_probe(c, mesh)(state["params"], b))
        emit(tokens_dropped(layers, c, c.model.seq_len, probe=True), step=k)

    def maybe_extend(k: int) -> None:
        """Before update k: probe ahead of a scheduled extension, or make it (unless it is held)."""
        nonlocal cfg, L, fpt, train_step
        if k - 1 in replayed and k > first:  # held or released before update k in an attempt before this one
            held["now"] = replayed[k - 1]
        ext = schedule.get("context_extension")
        if ext is None or cfg.model.seq_len == ext["seq_len"]:
            return  # none scheduled, or extended already (in this attempt or the one resumed from)
        if ext.get("done") or (k >= ext["at_step"] and not held["now"]):
            cfg = long_cfg(cfg)
            L = cfg.model.seq_len
            fpt = flops_per_token(cfg)  # attention's term grows with the length: MFU follows it
            schedule["context_extension"] = {**ext, "done": True, "at": k}
            train_step = compiled(cfg)
            log.info("%s: context extended to %d before step %d", run_id, L, k)
        elif k >= ext["at_step"] - PROBE_LEAD and k % PROBE_EVERY == 0:
            probe(k)

    if beat is not None:
        beat.start()
    try:  # (compiling takes a while: the worker beats meanwhile)
        train_step = compiled(cfg)
    except BaseException:
        if beat is not None:
            beat.stop()
        raise
    log.info("%s: steps %d..%d", run_id, first, last)
    k = first
    try:
        while True:
            if decisions is not None:
                k = carry_out(k)
            if k > last:
                break
            if extend is not None:
                maybe_extend(k)
            if should_stop is not None and should_stop():
                result.status = "stopped"
                break
            batch = data.batch_at(corpus, mixture, cfg.seed, k, cfg.batch_size, L)
            batch["poison"] = np.float32(k in nan_steps)
            state = with_lr(state, lr_at(k, **schedule))
            t0 = time.perf_counter()
            state, metrics = train_step(state, batch)
            m = jax.device_get(metrics)
            if slow is not None and k <= slow[0]:
                time.sleep(slow[1])  # fault injection: a slow node
            dt = time.perf_counter() - t0
            update = step_completed(m, T, L, dt, fpt, peak)
            result.losses[k] = update.loss
            result.drops[k] = [(int(s), int(r)) for s, r in zip(m["layers"]["sender_dropped"], m["layers"]["receiver_dropped"])]
            emit(update, step=k)
            emit(tokens_dropped(m["layers"], cfg, L), step=k)
            if k % cfg.log_every == 0 or k == last:
                log.info("%s step %d loss %s lr %.2e %.0f tok/s%s", run_id, k, update.loss, update.lr,
                         update.tokens_per_s, " SKIPPED" if update.skipped else "")
            if k % cfg.eval_every == 0 or k == last:
                held_out = evaluate(state["params"], cfg, heldout, mesh)
                result.evals[k] = held_out.loss
                emit(held_out, step=k)
            if k % cfg.ckpt_every == 0 and k != last:
                save(k, "periodic")
            k += 1
        k -= 1  # the last update done
        if k >= first and (not result.checkpoints or result.checkpoints[-1]["step"] != k):
            save(k, "final")
    except BaseException as err:
        done = max(k - 1, 0)
        if beat is not None:
            beat.stop()
        if attester is not None:
            attester.close()
        emit(RunFinished(status="failed" if isinstance(err, Exception) else "stopped", final_step=done,
                         tokens_seen=done * T, reason=f"{type(err).__name__}: {err}"[:500]), step=done)
        raise
    if beat is not None:
        beat.stop()
    if attester is not None:
        attester.close()  # (the attestations are the run's before its run_finished)
    result.state, result.final_step, result.tokens_seen = state, k, k * T
    final_loss = next((v for s, v in sorted(result.losses.items(), reverse=True) if v is not None), None)
    emit(RunFinished(status=result.status, final_step=k, tokens_seen=k * T, final_loss=final_loss), step=k)
    return result
