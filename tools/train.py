"""`runledger train`: a training worker (fresh, resumed from the ledger, or forked from a parent).

Where a run starts is decided over the ledger by `runledger.training.resume`; while it trains, the worker
carries out the run's decisions from the ledger at step boundaries (`runledger.training.decisions`).
`register(subparsers)` adds the subcommand; `run(args)` returns the exit code.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import signal

from runledger.ledger import settings
from runledger.tools import checks
from runledger.tools.args import UsageError, add_nats, add_root, resolve_nats

# jax, orbax and the worker are imported when a command runs: importing orbax configures the root
# logger, which would silence the CLI's own logging setup if it happened at parser-build time.

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="a training worker (--preset, --run-id, --resume, --fork-from)")
    p.add_argument("--preset", default="tiny", type=checks.preset, help="a preset of runledger.training.config (default tiny)")
    p.add_argument("--run-id", type=checks.run_id, required=True)
    add_root(p)
    add_nats(p)
    p.add_argument("--steps", type=checks.int_in(1, MAX_STEPS, "steps"), default=None, help="stop after this step (default: the preset's horizon)")
    p.add_argument("--resume", action="store_true", help="go on from the ledger's last checkpoint as attempt+1")
    p.add_argument("--fork-from", metavar="RUN@STEP", type=fork_point, default=None,
                   help="start from a parent's checkpoint at or before STEP (or RUN?_step=N, W&B's form)")
    p.add_argument("--horizon-steps", type=checks.int_in(1, MAX_STEPS, "steps"), default=None,
                   help="retime the decay to end at this step (e.g. a fork's early cooldown)")
    p.add_argument("--producer", type=checks.name_of("producer"), default="worker-0")
    p.add_argument("--emit", action=argparse.BooleanOptionalAction, default=True, help="emit events (default on)")
    p.add_argument("--decisions", action=argparse.BooleanOptionalAction, default=True,
                   help="carry out the run's decisions from the ledger at step boundaries (default on)")
    p.add_argument("--nan-at", type=checks.int_in(0, MAX_STEPS, "steps"), nargs="*", default=[], help="chaos: make these steps' loss non-finite")
    p.add_argument("--slow", metavar="UNTIL_STEP:SECONDS", type=pair_of("UNTIL_STEP:SECONDS", int, float), default=None,
                   help="chaos: each update up to UNTIL_STEP takes SECONDS longer (a slow node)")
    p.add_argument("--extend-context", metavar="AT_STEP:SEQ_LEN", type=pair_of("AT_STEP:SEQ_LEN", int, int), default=None,
                   help="a scheduled context extension (probed ahead; agents may hold it)")
    p.add_argument("--planned-tokens-per-s", type=checks.positive_float, default=None, help="the plan (default: from planned_mfu)")
    p.add_argument("--health", type=checks.health_profile, default=None, metavar="PROFILE",
                   help="the health profile the audits and agents hold the run to: default, marin, marin-2024 "
                        "(recorded as the config's health, as runledger.init(health=) does; a resume names it again)")
    p.add_argument("--threshold", action="append", type=assignment, default=[], metavar="NAME=VALUE",
                   help="override an agent/audit threshold for this run (recorded in run_started)")
    p.add_argument("--set", action="append", type=assignment, default=[], metavar="SECTION.FIELD=VALUE", dest="overrides",
                   help="override a config field, e.g. moe.cf_recv=0.6 (recorded, and in the config hash)")
    p.set_defaults(func=run)


MAX_STEPS = 10**12  # far past any run's steps, well inside an int64


def fork_point(text: str) -> str:
    """RUN@STEP or RUN?_step=N (W&B's): a run id and a step (runledger.queries.forks.parse_point)."""
    from runledger.queries.forks import parse_point

    try:
        point = parse_point(checks.line(text))
    except ValueError as err:
        raise checks.Bad(str(err)) from None
    checks.int_in(0, MAX_STEPS, "a step")(str(point.step))
    return f"{point.run_id}@{point.step}"


def pair_of(form: str, a, b):
    """A check of A:B (a step and seconds, say): both parts numbers, finite and >= 0."""
    def check(text: str) -> str:
        x, colon, y = checks.line(text).partition(":")
        try:
            values = a(x), b(y)
        except ValueError:
            values = None
        if not colon or values is None or any(not 0 <= v < float("inf") for v in values):
            raise checks.Bad(f"{checks.shown(text)} is not {form} (two numbers >= 0)")
        return text
    return check


def assignment(text: str) -> str:
    """NAME=VALUE on one line."""
    if "=" not in checks.line(text) or text.startswith("="):
        raise checks.Bad(f"{checks.shown(text)} is not NAME=VALUE")
    return text


def _pair(text: str | None, a, b):
    if not text:
        return None
    x, _, y = text.partition(":")
    return a(x), b(y)


def with_overrides(cfg, overrides: list[str]):
    """The config with SECTION.FIELD=VALUE (or FIELD=VALUE) overrides; values parsed as JSON when they can be."""
    for kv in overrides:
        key, sep, raw = kv.partition("=")
        if not sep:
            raise UsageError(f"--set {kv!r} is not SECTION.FIELD=VALUE")
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
            raise UsageError(f"--set {kv!r}: {err}") from None
    return cfg


def parse_thresholds(pairs: list[str]) -> dict[str, float]:
    """--threshold NAME=VALUE pairs: names of the rule book (queries/thresholds.py), numeric values."""
    from runledger.queries.thresholds import NAMES

    out = {}
    for kv in pairs:
        name, _, value = kv.partition("=")
        if name not in NAMES:
            raise UsageError(f"--threshold {kv!r}: no threshold {name!r} (known: {', '.join(sorted(NAMES))})")
        try:
            out[name] = float(value)
        except ValueError:
            raise UsageError(f"--threshold {kv!r}: {value!r} is not a number") from None
    return out


def config_of(args):
    """The run's config: the preset, its --set overrides and its --health profile (in the config, as
    `runledger.init(health=)` records it, and so in its hash: a resume of the run names it again)."""
    from runledger.training.config import preset

    cfg = with_overrides(preset(args.preset), args.overrides)
    return cfg if args.health is None else dataclasses.replace(cfg, health=args.health)


def run(args) -> int:
    from runledger.training.config import config_hash
    from runledger.training.decisions import ledger_decisions
    from runledger.training.resume import ckpt_dir, fork_point, resume_point
    from runledger.training.schedule import retime
    from runledger.training.worker import Start, make_mesh, train

    logging.getLogger("absl").setLevel(logging.WARNING)  # orbax's per-save chatter
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU here" on every start
    cfg = config_of(args)
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
        try:  # a horizon inside warmup, or not after the next step, is refused (runledger.training.schedule.retime)
            start = dataclasses.replace(start, schedule=retime(sched, start.step + 1, args.horizon_steps))
        except ValueError as err:
            log.error("--horizon-steps %d: %s", args.horizon_steps, err)
            return 2

    from runledger.ledger.emit.sink import NullSink

    sink = NullSink()
    if args.emit:
        from runledger.ledger.emit.emitter import Emitter

        sink = Emitter(args.run_id, args.producer, start.attempt, resolve_nats(args), settings.spool_dir(args.root))
    feed = None
    if args.decisions and args.emit:  # live from NATS; decisions applied in earlier attempts stay applied
        from runledger.ledger.contract import decision_state
        from runledger.ledger.decisions.inbox import DecisionFeed
        from runledger.ledger.check.replay import replay_run
        from runledger.training.decisions import feed_decisions

        done = decision_state.answered(replay_run(args.root, args.run_id).decisions) if args.resume else set()
        feed = DecisionFeed(args.run_id, resolve_nats(args), applied=done)
        source = feed_decisions(feed)
    elif args.decisions:
        source = ledger_decisions(args.root, args.run_id)
    else:
        source = None
    slow = None
    if args.slow:
        until, _, secs = args.slow.partition(":")
        slow = (int(until), float(secs))
    thresholds = parse_thresholds(args.threshold)
    stop = {"now": False}

    def on_signal(signum, _frame):
        log.warning("signal %d: stopping at the next step boundary", signum)
        stop["now"] = True

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        result = train(cfg, run_id=args.run_id, ckpt_dir=ckpt_dir(args.root, args.run_id), sink=sink,
                       start=start, steps=args.steps, preset=args.preset, mesh=make_mesh(cfg),
                       nan_steps=frozenset(args.nan_at), should_stop=lambda: stop["now"],
                       decisions=source, planned_tokens_per_s=args.planned_tokens_per_s, thresholds=thresholds,
                       slow=slow, extend=_pair(args.extend_context, int, int), tlog_root=args.root)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if feed is not None:
            feed.close()
        sink.close()
    log.info("%s: %s at step %d (%d tokens)", args.run_id, result.status, result.final_step, result.tokens_seen)
    return 0


def _default_schedule(cfg) -> dict:
    from runledger.training.schedule import make_schedule

    o = cfg.optim
    return make_schedule(o.peak_lr, o.warmup_steps, cfg.steps, o.min_lr_ratio, tokens_per_step=cfg.tokens_per_step)
