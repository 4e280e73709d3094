"""`runledger train`: a training worker (fresh, resumed from the ledger, or forked from a parent).

`register(subparsers)` adds the subcommand; `run(args)` returns the exit code. Where a run starts
is decided by two small functions over the ledger: `resume_point` (the last checkpoint and the
schedule in force, as attempt+1) and `fork_point` (the parent's checkpoint at or before a step). While it trains, the worker carries out the
run's decisions from the ledger at step boundaries (`training.decisions`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
from pathlib import Path

from training.config import PRESETS, config_hash, preset
from training.schedule import make_schedule, retime

# jax, orbax and the worker are imported when a command runs: importing orbax configures the root
# logger, which would silence the CLI's own logging setup if it happened at parser-build time.

log = logging.getLogger(__name__)


def ckpt_dir(root: str | Path, run_id: str) -> Path:
    return Path(root) / "checkpoints" / run_id


def resume_point(root: str | Path, run_id: str) -> tuple["Start", str | None]:
    """Where a resumed run goes on: (Start as attempt+1, the run's recorded config hash).

    The ledger's replay gives the last checkpoint, the schedule in force and the attempts so far;
    without ledger events (emission was off) the newest local checkpoint is used instead.
    """
    from ledger.replay import replay_run
    from training import checkpoint
    from training.worker import Start

    try:
        state = replay_run(root, run_id)
    except (FileNotFoundError, OSError, ValueError):
        state = None
    attempts = state.attempts if state is not None else {}
    attempt = max(attempts) + 1 if attempts else 1
    first_hash = attempts[min(attempts)]["config_hash"] if attempts else None  # before any decision
    ckpt = state.last_checkpoint if state is not None else None
    if ckpt is None:
        ckpt = checkpoint.latest(ckpt_dir(root, run_id))
    if ckpt is None:
        return Start(attempt=attempt, schedule=(state.schedule or None) if state else None), first_hash
    meta = checkpoint.read_meta(ckpt["path"])
    schedule = (state.schedule if state is not None and state.schedule else None) or meta.get("schedule")
    dispatch = (state.dispatch if state is not None and state.dispatch else None) or meta.get("dispatch")
    return (Start(attempt=attempt, checkpoint_path=ckpt["path"], step=int(ckpt["step"]), schedule=schedule,
                  content_hash=ckpt["content_hash"], dispatch=dispatch), first_hash or meta.get("config_hash"))


def fork_point(root: str | Path, parent_run: str, at_step: int) -> "Start":
    """A new run starting from `parent_run`'s newest checkpoint at or before `at_step`."""
    from ledger.replay import run_events
    from training import checkpoint
    from training.worker import Start

    try:
        saved = [(e["step"], e["payload"]) for e in run_events(root, parent_run, full=True) if e["kind"] == "checkpoint"]
    except (FileNotFoundError, OSError, ValueError):
        saved = []
    saved = [(s, p) for s, p in saved if s is not None and s <= at_step]
    if saved:
        step, payload = max(saved, key=lambda sp: sp[0])
        path, digest = payload["path"], payload["content_hash"]
    else:  # not in the ledger (emission off): the parent's local checkpoints
        meta = checkpoint.latest(ckpt_dir(root, parent_run), at_or_before=at_step)
        if meta is None:
            raise ValueError(f"run {parent_run!r} has no checkpoint at or before step {at_step}")
        step, path, digest = meta["step"], meta["path"], meta["content_hash"]
    meta = checkpoint.read_meta(path)
    return Start(attempt=0, checkpoint_path=path, step=int(step), schedule=meta.get("schedule"), content_hash=digest,
                 dispatch=meta.get("dispatch"), parent={"run_id": parent_run, "step": int(step), "content_hash": digest, "path": path})


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="a training worker (--preset, --run-id, --resume, --fork-from)")
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--run-id", required=True)
    p.add_argument("--nats", default=None, help="NATS URL (env RUNLEDGER_NATS; default: the server `nats up` started)")
    p.add_argument("--root", default=os.environ.get("RUNLEDGER_ROOT", "./runledger-data"))
    p.add_argument("--steps", type=int, default=None, help="stop after this step (default: the preset's horizon)")
    p.add_argument("--resume", action="store_true", help="go on from the ledger's last checkpoint as attempt+1")
    p.add_argument("--fork-from", metavar="RUN@STEP", default=None, help="start from a parent's checkpoint")
    p.add_argument("--horizon-steps", type=int, default=None,
                   help="retime the decay to end at this step (e.g. a fork's early cooldown)")
    p.add_argument("--producer", default="worker-0")
    p.add_argument("--emit", action=argparse.BooleanOptionalAction, default=True, help="emit events (default on)")
    p.add_argument("--decisions", action=argparse.BooleanOptionalAction, default=True,
                   help="carry out the run's decisions from the ledger at step boundaries (default on)")
    p.add_argument("--nan-at", type=int, nargs="*", default=[], help="chaos: make these steps' loss non-finite")
    p.add_argument("--slow", metavar="UNTIL_STEP:SECONDS", default=None,
                   help="chaos: each update up to UNTIL_STEP takes SECONDS longer (a slow node)")
    p.add_argument("--extend-context", metavar="AT_STEP:SEQ_LEN", default=None,
                   help="a scheduled context extension (probed ahead; agents may hold it)")
    p.add_argument("--planned-tokens-per-s", type=float, default=None, help="the plan (default: from planned_mfu)")
    p.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                   help="override an agent/audit threshold for this run (recorded in run_started)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", dest="overrides",
                   help="override a config field, e.g. moe.cf_recv=0.6 (recorded, and in the config hash)")
    p.add_argument("--creds", default=None, help="credentials file from `nats up --secure` (env RUNLEDGER_CREDS)")
    p.set_defaults(func=run)


def _pair(text: str | None, a, b):
    if not text:
        return None
    x, _, y = text.partition(":")
    return a(x), b(y)


def with_overrides(cfg, overrides: list[str]):
    """The config with SECTION.FIELD=VALUE (or FIELD=VALUE) overrides; values parsed as JSON when they can be."""
    import json

    for kv in overrides:
        key, sep, raw = kv.partition("=")
        if not sep:
            raise SystemExit(f"runledger train: --set {kv!r} is not SECTION.FIELD=VALUE")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        section, _, name = key.rpartition(".")
        try:
            if section:
                sub = getattr(cfg, section)
                cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(sub, **{name: value})})
            else:
                cfg = dataclasses.replace(cfg, **{name: value})
        except (AttributeError, TypeError, ValueError) as err:
            raise SystemExit(f"runledger train: --set {kv!r}: {err}") from None
    return cfg


def _nats_url(args) -> str:
    if getattr(args, "creds", None) or os.environ.get("RUNLEDGER_CREDS"):
        from ledger.natsserver import read_creds

        return read_creds(args.creds or os.environ["RUNLEDGER_CREDS"])
    if args.nats:
        return args.nats
    if os.environ.get("RUNLEDGER_NATS"):
        return os.environ["RUNLEDGER_NATS"]
    from ledger import bus, natsserver

    url_file = natsserver.nats_dir(args.root) / "url"
    return url_file.read_text().strip() if url_file.exists() else bus.DEFAULT_URL


def run(args) -> int:
    from training.decisions import ledger_decisions
    from training.worker import Start, make_mesh, train

    logging.getLogger("absl").setLevel(logging.WARNING)  # orbax's per-save chatter
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU here" on every start
    cfg = with_overrides(preset(args.preset), args.overrides)
    if args.resume and args.fork_from:
        log.error("--resume and --fork-from exclude each other")
        return 2
    start = Start()
    try:
        if args.resume:
            start, recorded_hash = resume_point(args.root, args.run_id)
            if recorded_hash and recorded_hash != config_hash(cfg):
                log.error("run %s was recorded with config %s…, preset %s is %s…", args.run_id, recorded_hash[:12],
                          args.preset, config_hash(cfg)[:12])
                return 2
        elif args.fork_from:
            parent, _, step = args.fork_from.partition("@")
            start = fork_point(args.root, parent, int(step))
    except ValueError as err:
        log.error("%s", err)
        return 2
    if args.horizon_steps is not None:
        sched = start.schedule or _default_schedule(cfg)
        try:  # a horizon inside warmup, or not after the next step, is refused (training.schedule.retime)
            start = dataclasses.replace(start, schedule=retime(sched, start.step + 1, args.horizon_steps))
        except ValueError as err:
            log.error("--horizon-steps %d: %s", args.horizon_steps, err)
            return 2

    emitter = None
    if args.emit:
        from ledger.emitter import Emitter

        emitter = Emitter(args.run_id, args.producer, start.attempt, _nats_url(args), Path(args.root) / "spool")
    feed = None
    if args.decisions and args.emit:  # live from NATS; decisions applied in earlier attempts stay applied
        from ledger.decisions import DecisionFeed
        from ledger.replay import replay_run
        from training.decisions import feed_decisions

        done = {did for did, d in replay_run(args.root, args.run_id).decisions.items()
                if d.get("applied_at_step") is not None} if args.resume else set()
        feed = DecisionFeed(args.run_id, _nats_url(args), applied=done)
        source = feed_decisions(feed)
    elif args.decisions:
        source = ledger_decisions(args.root, args.run_id)
    else:
        source = None
    slow = None
    if args.slow:
        until, _, secs = args.slow.partition(":")
        slow = (int(until), float(secs))
    thresholds = {}
    for kv in args.threshold:
        name, _, value = kv.partition("=")
        thresholds[name] = float(value)
    stop = {"now": False}

    def on_signal(signum, _frame):
        log.warning("signal %d: stopping at the next step boundary", signum)
        stop["now"] = True

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        result = train(cfg, run_id=args.run_id, ckpt_dir=ckpt_dir(args.root, args.run_id), emitter=emitter,
                       start=start, steps=args.steps, preset=args.preset, mesh=make_mesh(cfg),
                       nan_steps=frozenset(args.nan_at), should_stop=lambda: stop["now"],
                       decisions=source, planned_tokens_per_s=args.planned_tokens_per_s, thresholds=thresholds,
                       slow=slow, extend=_pair(args.extend_context, int, int))
    finally:
        signal.signal(signal.SIGTERM, previous)
        if feed is not None:
            feed.close()
        if emitter is not None:
            emitter.close()
    log.info("%s: %s at step %d (%d tokens)", args.run_id, result.status, result.final_step, result.tokens_seen)
    return 0


def _default_schedule(cfg) -> dict:
    o = cfg.optim
    return make_schedule(o.peak_lr, o.warmup_steps, cfg.steps, o.min_lr_ratio, tokens_per_step=cfg.tokens_per_step)
