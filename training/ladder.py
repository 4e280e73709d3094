"""The scaling ladder: train the rungs (each a run in the ledger, tagged with its ladder and rung), fit
L = E + A * C^(-alpha) over them at every 5% of training, and emit the target run's `forecast` events.

    run_ladder("main", root="data", nats_url=url, target_preset="small", n_rungs=4)

Rungs are the `rung0..rung{n-1}` presets' sizes on the target's recipe (sequence length, batch,
optimizer, data), each trained for the tokens that keep the tokens per active parameter fixed across
the ladder (the target's ratio by default: the target is the ladder's next rung, as in Marin's
ladders), so compute grows with the square of the active parameters. Each rung's
loss curve is recorded as its worker emits it (a rung that dies keeps what it reached); the fit
itself is `runledger.training.ladder_joint` (every fraction at once: one E, an exponent smooth in the
fraction; the default) or `runledger.training.ladder_fit` (a law per fraction); E fitted by default, a fixed E
the option. Forecasts are emitted by producer `ladder` on the target run's subjects, one per fraction;
a re-run forecasts as the next attempt, and the audits read the latest. When a decision changes the
plan, `runledger.training.reforecast` issues a revision of them for the new plan.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from runledger.ledger.emit.chains import next_attempt
from runledger.ledger.contract.events import ForecastMade, Payload, RunFinished, RunStarted, StepCompleted
from runledger.ledger.emit.sink import EventSink, NullSink, payload_of
from runledger.training.config import TrainConfig, preset
from runledger.training.ladder_fit import FRACTIONS, Curve, Forecast, forecast, self_check
from runledger.training.ladder_joint import fit_joint

log = logging.getLogger(__name__)

MIN_RUNG_STEPS = 10  # below this a rung's curve is mostly warmup
RATIO_TOL = 0.1  # a rung within 10% of the target's tokens per active parameter trains at the ladder's ratio
LEDGER_WAIT_S = 15.0  # how long to wait for a ledger to say a run's next attempt


@dataclass(frozen=True)
class Rung:
    run_id: str
    preset: str
    cfg: TrainConfig
    index: int


@dataclass
class LadderResult:
    ladder: str
    target_run: str
    target_flops: float
    target_tokens: int
    curves: list[Curve]
    forecasts: list[Forecast]
    self_check_error: float | None
    self_check_errors: dict[str, float] = field(default_factory=dict)
    refusals: dict[float, str] = field(default_factory=dict)  # fraction -> why no forecast there
    method: str = "joint"
    E: float | None = None  # the irreducible loss given (None: fitted)


def tokens_per_param(cfg: TrainConfig) -> float:
    from runledger.training.flops import active_params  # (JAX: not for what only fits or re-forecasts)

    return cfg.token_budget / active_params(cfg)


def rung_configs(n_rungs: int, tpp: float, steps_scale: float = 1.0,
                 recipe: TrainConfig | None = None) -> list[tuple[str, TrainConfig]]:
    """The rungs' (preset name, config): the `rungN` presets' sizes (width, depth, expert widths) on the
    target's `recipe` (sequence length, batch, optimizer, data, router settings; the presets' own when
    None), each trained for `tpp` tokens per active parameter (times `steps_scale`, a knob for quick
    ladders), with warmup the same fraction of training as the recipe's and cadences scaled alike."""
    from runledger.training.flops import active_params

    out = []
    for i in range(n_rungs):
        name = f"rung{i}"
        size = preset(name)
        base = size if recipe is None else dataclasses.replace(
            recipe,
            model=dataclasses.replace(recipe.model, d_model=size.model.d_model, n_layers=size.model.n_layers,
                                      n_heads=size.model.n_heads),
            moe=dataclasses.replace(recipe.moe, d_ff_shared=size.moe.d_ff_shared, d_latent=size.moe.d_latent,
                                    d_ff_expert=size.moe.d_ff_expert))
        steps = max(MIN_RUNG_STEPS, round(steps_scale * tpp * active_params(base) / base.tokens_per_step))
        warmup = base.optim.warmup_steps / max(base.steps, 1)
        cfg = dataclasses.replace(
            base, steps=steps, eval_every=max(steps // 4, 1), ckpt_every=steps, log_every=max(steps // 5, 1),
            optim=dataclasses.replace(base.optim, warmup_steps=max(round(warmup * steps), 1)))
        out.append((name, cfg))
    return out


def ratio_flags(rung_tpp: dict[str, float], target_tpp: float) -> list[str]:
    """A flag naming the rungs that do not train at the target's tokens per active parameter (more than
    RATIO_TOL off), with each one's ratio to it; none when every rung does. The ladder's law is a line
    through rungs at one ratio (`rung_configs`): `--steps-scale` and the MIN_RUNG_STEPS clamp move rungs off it."""
    off = {name: tpp / target_tpp for name, tpp in rung_tpp.items() if abs(tpp / target_tpp - 1) > RATIO_TOL}
    if not off:
        return []
    return [f"the rungs do not all train at the target's {target_tpp:.3g} tokens per active parameter: "
            + ", ".join(f"{name} {r:.2f}x" for name, r in off.items())
            + " (steps scaled or clamped): the law is read off rungs at other ratios than the target's"]


def rung_tag(ladder: str, r: "Rung", target_run: str, rung_tpp: float, target_tpp: float) -> dict:
    """The `ladder` tag of a rung's run_started: its own tokens per active parameter and the target's."""
    return {"name": ladder, "rung": r.index, "target": target_run, "preset": r.preset,
            "tokens_per_active_param": float(rung_tpp), "target_tokens_per_active_param": float(target_tpp)}


class RungSink:
    """A rung worker's sink: tags `run_started` with the ladder, records the loss curve as the worker
    emits it (so a rung that dies partway still has the curve it reached), and passes every event on
    to `inner` (the NATS Emitter, or a NullSink when nothing is recorded)."""

    def __init__(self, inner: EventSink, ladder_tag: dict):
        self.inner, self.tag = inner, ladder_tag
        self.producer = inner.producer
        self.tokens: list[float] = []
        self.loss: list[float] = []
        self.tokens_per_step = 0
        self.token_budget = 0.0
        self.flops_per_token = 0.0
        self.status: str | None = None

    def emit(self, event: Payload, step: int | None = None):
        if isinstance(event, RunStarted):
            event = RunStarted.model_validate({**payload_of(event), "ladder": self.tag})
            self.tokens_per_step = int(event.tokens_per_step or 0)
            self.token_budget = float(event.token_budget)
            self.flops_per_token = float(event.flops_per_token or 0.0)
        elif isinstance(event, StepCompleted) and event.loss is not None and step is not None:
            self.tokens.append(float(step * self.tokens_per_step))
            self.loss.append(float(event.loss))
        elif isinstance(event, RunFinished):
            self.status = event.status
        return self.inner.emit(event, step=step)

    def emit_many(self, events: Sequence[Payload], steps: Sequence[int | None] | None = None) -> list:
        return [self.emit(e, s) for e, s in zip(events, [None] * len(events) if steps is None else steps)]

    def close(self) -> bool:
        return self.inner.close()

    def curve(self, name: str) -> Curve:
        complete = self.status == "completed" and bool(self.tokens) and self.tokens[-1] >= self.token_budget
        return Curve(name, np.array(self.tokens), np.array(self.loss), self.token_budget, self.flops_per_token,
                     complete=complete)


def train_rungs(rungs: list[Rung], *, ladder: str, target_run: str, root: str | Path, nats_url: str | None,
                tpp: float, peak_flops: float | None = None, stop_after: dict[int, int] | None = None) -> list[Curve]:
    """Train each rung as its own run (producer worker-0) and return the loss curves they reached.

    `stop_after` {rung index: step} ends those rungs early (a drill: a rung that died partway)."""
    from runledger.ledger.emit.emitter import Emitter
    from runledger.training.resume import ckpt_dir
    from runledger.training.flops import active_params, measure_peak_flops
    from runledger.training.worker import train

    spool = Path(root) / "spool"
    peak = peak_flops if peak_flops is not None else measure_peak_flops()
    curves = []
    for r in rungs:
        attempt = next_attempt(r.run_id, "worker-0", spool, nats_url=nats_url, wait_s=LEDGER_WAIT_S)
        inner = Emitter(r.run_id, "worker-0", attempt, nats_url, spool) if nats_url else NullSink()
        rec = RungSink(inner, rung_tag(ladder, r, target_run, r.cfg.token_budget / active_params(r.cfg), tpp))
        log.info("ladder %s: rung %d (%s, %d active params, %d steps) as run %s", ladder, r.index, r.preset,
                 active_params(r.cfg), r.cfg.steps, r.run_id)
        try:
            train(r.cfg, run_id=r.run_id, ckpt_dir=ckpt_dir(root, r.run_id) / str(attempt), sink=rec,
                  preset=r.preset, peak_flops=peak, steps=(stop_after or {}).get(r.index))
        except Exception:  # the rung is kept: its tail is extrapolated and flagged by the fit
            log.exception("ladder %s: rung %s died at %d tokens", ladder, r.run_id, rec.tokens[-1] if rec.tokens else 0)
        finally:
            rec.close()
        curves.append(rec.curve(r.run_id))
    return curves


def curves_from_ledger(root: str | Path, run_ids: list[str]) -> list[Curve]:
    """The rungs' loss curves read back from the ledger (`steps` and `runs` views)."""
    from runledger import queries

    con = queries.connect(root)
    curves = []
    for run_id in run_ids:
        plan = con.execute("select token_budget, flops_per_token from runs where run_id = ? "
                           "order by attempt, seq limit 1", [run_id]).fetchone()
        if plan is None:
            raise ValueError(f"run {run_id!r} has no run_started in the ledger at {root}")
        rows = con.execute("select step, loss, sum(tokens) over (order by step) from steps where run_id = ? "
                           "order by step", [run_id]).fetchall()
        status = con.execute("select status from runs_finished where run_id = ? order by attempt desc, seq desc "
                             "limit 1", [run_id]).fetchone()
        tokens = np.array([r[2] for r in rows if r[1] is not None], float)
        loss = np.array([r[1] for r in rows if r[1] is not None], float)
        complete = status is not None and status[0] == "completed" and len(tokens) and tokens[-1] >= plan[0]
        curves.append(Curve(run_id, tokens, loss, float(plan[0]), float(plan[1]), complete=bool(complete)))
    return curves


METHODS = ("joint", "per_fraction")


def fit_ladder(curves: list[Curve], target_flops: float, E: float | None = None,
               fractions=FRACTIONS, extra_flags: list[str] | None = None,
               refusals: dict[float, str] | None = None, method: str = "joint") -> tuple[list[Forecast], float | None, dict]:
    """A forecast per fraction, and the self-check (worst error, error per rung).

    `method` "joint" (the default): every fraction fitted at once (`runledger.training.ladder_joint`);
    "per_fraction": one law per fraction (`runledger.training.ladder_fit.forecast`). A fraction the rungs cannot
    forecast is logged (one line, naming the rung) and, when `refusals` is given, recorded there as
    {fraction: reason}; it is never emitted as a forecast."""
    if method not in METHODS:
        raise ValueError(f"unknown fit method {method!r} (methods: {', '.join(METHODS)})")
    usable = [c for c in curves if len(c.tokens) >= 2]
    flags = list(extra_flags or [])
    flags += [f"{c.name}: dropped (fewer than 2 finite losses)" for c in curves if len(c.tokens) < 2]
    worst, errors = self_check(usable)
    refused: dict[float, str] = {}
    out = []
    if method == "joint":
        try:
            joint = fit_joint(usable, E, fractions, refused)
        except ValueError as err:
            joint, refused = None, {g: str(err) for g in fractions}
        for g in fractions:
            if joint is None or g in refused:
                continue
            try:
                out.append(joint.forecast(target_flops, g))
            except ValueError as err:
                refused[g] = str(err)
    else:
        for g in fractions:
            try:
                out.append(forecast(usable, target_flops, g, E))
            except ValueError as err:
                refused[g] = str(err)
    for g, why in sorted(refused.items()):
        log.warning("no forecast at %.0f%%: %s", 100 * g, why)
    if refusals is not None:
        refusals.update(refused)
    return [dataclasses.replace(f, flags=flags + f.flags) for f in out], worst, errors


def forecast_made(f: Forecast, target_run: str, target_tokens: int, self_check_error: float | None,
                  method: str | None = None, E: float | None = None, **plan) -> ForecastMade:
    """The `forecast` event of one point: of the registered plan (`target_tokens` its horizon), or with
    `plan` (revision, decision_id, from_step, from_tokens, supported) of a revision."""
    return ForecastMade(target_run=target_run, fraction=f.fraction, target_tokens=int(round(f.fraction * target_tokens)),
                        target_flops=f.target_flops, projected_loss=f.projected_loss, band_low=f.band_low,
                        band_high=f.band_high, band_level=f.band_level, fit=f.law.as_dict(), rungs=f.rungs, flags=f.flags,
                        self_check_error=self_check_error, method=method, e_fixed=E,
                        horizon_tokens=int(target_tokens), **plan)


def emit_forecasts(result: LadderResult, *, root: str | Path, nats_url: str) -> int:
    """Emit one `forecast` per fraction on the target's subjects (producer `ladder`, the next attempt)."""
    from runledger.ledger.emit.emitter import Emitter

    spool = Path(root) / "spool"
    attempt = next_attempt(result.target_run, "ladder", spool, nats_url=nats_url, wait_s=LEDGER_WAIT_S)
    em = Emitter(result.target_run, "ladder", attempt, nats_url, spool)
    try:
        em.emit_many([forecast_made(f, result.target_run, result.target_tokens, result.self_check_error,
                                    result.method, result.E) for f in result.forecasts])
    finally:
        em.close()
    return len(result.forecasts)


def run_ladder(target_run: str, *, root: str | Path, nats_url: str | None, target_preset: str = "small",
               n_rungs: int = 4, ladder: str | None = None, steps_scale: float = 1.0, tpp: float | None = None,
               E: float | None = None, peak_flops: float | None = None,
               from_ledger: bool = False, stop_after: dict[int, int] | None = None, method: str = "joint",
               horizon_steps: int | None = None) -> LadderResult:
    """Train the ladder for `target_run` (or read its rungs back from the ledger), fit it at every 5% of
    training, and emit the forecasts when `nats_url` is given. `horizon_steps`: the target's planned
    horizon when it is not its preset's (the run's `--horizon-steps`)."""
    from runledger.training.flops import flops_per_token

    target = preset(target_preset)
    if horizon_steps is not None:
        target = dataclasses.replace(target, steps=int(horizon_steps))
    ladder = ladder or f"{target_run}-ladder"
    tpp = tpp if tpp is not None else tokens_per_param(target)
    rungs = [Rung(f"{ladder}-r{i}", name, cfg, i)
             for i, (name, cfg) in enumerate(rung_configs(n_rungs, tpp, steps_scale, recipe=target))]
    if from_ledger:
        curves = curves_from_ledger(root, [r.run_id for r in rungs])
    else:
        curves = train_rungs(rungs, ladder=ladder, target_run=target_run, root=root, nats_url=nats_url, tpp=tpp,
                             peak_flops=peak_flops, stop_after=stop_after)
    from runledger.training.flops import active_params

    target_flops = flops_per_token(target) * target.token_budget
    refusals: dict[float, str] = {}
    ratio = ratio_flags({r.run_id: r.cfg.token_budget / active_params(r.cfg) for r in rungs}, tpp)
    forecasts, worst, errors = fit_ladder(curves, target_flops, E, refusals=refusals, method=method, extra_flags=ratio)
    result = LadderResult(ladder, target_run, target_flops, target.token_budget, curves, forecasts, worst, errors,
                          refusals, method, E)
    for c in curves:
        log.info("rung %s: %.3g FLOPs planned, reached %.0f%%, self-check error %s", c.name, c.planned_flops,
                 100 * c.reached, f"{errors[c.name]:+.3f}" if c.name in errors else "n/a")
    for f in forecasts:
        log.info("forecast %s at %3.0f%%: %.3f [%.3f, %.3f] (%s band) alpha %.3f", target_run, 100 * f.fraction,
                 f.projected_loss, f.band_low, f.band_high,
                 f"{f.band_level:.0%}" if f.band_level is not None else "no stated level", f.law.alpha)
    if nats_url:
        emit_forecasts(result, root=root, nats_url=nats_url)
    return result
