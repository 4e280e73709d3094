"""`runledger ladder`: train the scaling ladder for a target run and emit its loss forecast.

    runledger ladder --preset small --rungs 4 --target main --root data --nats nats://127.0.0.1:4222

`--preset` is the target's preset (its compute and tokens per active parameter size the ladder);
`--from-ledger` re-fits rungs already in the ledger instead of training them; `--fit` chooses every
fraction fitted at once (joint, the default) or one law per fraction; `--revise` trains nothing and re-issues
the forecast for each plan change an applied decision made to the target (the agents process does the
same on its own). The logic is in
`runledger.training.ladder`; `register(subparsers)` adds the subcommand. Nothing of the ladder (numpy,
scipy, JAX) is imported until the command runs.
"""

from __future__ import annotations

import argparse
import logging

from runledger.tools import checks
from runledger.tools.args import UsageError, add_nats, add_root, resolve_nats

MAX_SCALE = 1000.0  # a rung's steps times this: far past any ladder's
MAX_TPP = 100_000.0  # tokens per active parameter: ~5000x Chinchilla's 20

log = logging.getLogger(__name__)


def _e_arg(text: str) -> float | None:
    if text == "fit":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--E takes a number or 'fit', not {text!r}") from None


def register(subparsers) -> None:
    p = subparsers.add_parser("ladder", help="the scaling ladder and its loss forecast for a target run")
    p.add_argument("--preset", default="small", type=checks.preset, help="the target run's preset")
    p.add_argument("--rungs", type=checks.positive, default=4, help="rungs (presets rung0..rungN-1; default 4)")
    p.add_argument("--target", type=checks.run_id, required=True, help="the run the forecast is for")
    p.add_argument("--ladder", type=checks.name_of("ladder name"), default=None, help="ladder name (default TARGET-ladder); rungs are NAME-r0..")
    p.add_argument("--steps-scale", type=checks.float_in(0.0, MAX_SCALE, low_open=True), default=1.0, help="scale every rung's steps (quick ladders)")
    p.add_argument("--tpp", type=checks.float_in(0.0, MAX_TPP, low_open=True), default=None,
                   help="tokens per active parameter of every rung (default: the target's)")
    p.add_argument("--E", type=_e_arg, default=None,
                   help="irreducible loss in nats/byte (a number, e.g. runledger.training.ladder_fit.DEFAULT_E: fixed, the band "
                        "leave-one-rung-out), or 'fit' (the default: fitted, the band carries its uncertainty)")
    p.add_argument("--from-ledger", action="store_true", help="fit the rungs already in the ledger, train nothing")
    p.add_argument("--fit", choices=["joint", "per-fraction"], default="joint",
                   help="joint (default): every fraction fitted at once (one E, an exponent smooth in the "
                        "fraction); per-fraction: a law per fraction")
    p.add_argument("--horizon-steps", type=checks.int_in(0, 10**12, "steps"), default=None,
                   help="the target's planned horizon when it is not its preset's (as `train --horizon-steps`)")
    p.add_argument("--revise", action="store_true",
                   help="train nothing: re-forecast each plan change an applied decision made to the target")
    p.add_argument("--emit", action=argparse.BooleanOptionalAction, default=True, help="emit events (default on)")
    add_root(p)
    add_nats(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from runledger.training.ladder import run_ladder

    logging.getLogger("absl").setLevel(logging.WARNING)
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    if not 1 <= args.rungs <= 4:
        raise UsageError(f"--rungs must be 1..4 (the presets rung0..rung3), not {args.rungs}")
    if args.steps_scale <= 0:
        raise UsageError("--steps-scale must be > 0")
    if args.horizon_steps is not None and args.horizon_steps < 1:
        raise UsageError("--horizon-steps must be >= 1")
    if args.revise:
        from runledger.training.reforecast import emit_revisions

        if not args.emit:
            raise UsageError("--revise emits the revisions: it cannot go with --no-emit")
        n = emit_revisions(args.root, args.target, resolve_nats(args))
        log.info("ladder: %d revised forecast points for %s", n, args.target)
        return 0
    try:
        result = run_ladder(args.target, root=args.root, nats_url=resolve_nats(args) if args.emit else None,
                            target_preset=args.preset, n_rungs=args.rungs, ladder=args.ladder,
                            steps_scale=args.steps_scale, tpp=args.tpp, E=args.E, from_ledger=args.from_ledger,
                            method=args.fit.replace("-", "_"), horizon_steps=args.horizon_steps)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if not result.forecasts:
        why = next(iter(result.refusals.values()), "no rung reached any fraction")
        log.error("ladder %s: no forecast could be fitted: %s", result.ladder, why)
        return 1
    log.info("ladder %s: %d forecasts for %s; self-check error %s", result.ladder, len(result.forecasts),
             result.target_run, "n/a" if result.self_check_error is None else f"{result.self_check_error:.3f}")
    return 0
