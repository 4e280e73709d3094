"""The ladder's forecast with every fraction fitted at once, a law in (compute, fraction):
L_g(C) = E + A_g * C^(-alpha(g)), alpha(g) = a0 + a1 ln g: one E for all fractions g of training, an
exponent that moves smoothly with g, and a scale A_g per fraction.

    fit = fit_joint(curves, E=None)                    # rungs read at every 5%, one (E, a0, a1)
    f = fit.forecast(target_flops, g=0.5)              # a runledger.training.ladder_fit.Forecast
    f = fit.forecast(target_flops, g=0.5, read_at=0.4) # rungs read elsewhere in their schedule

Why: E is the irreducible loss, no property of the schedule; and at a fixed number of tokens per
parameter, Chinchilla's L(N, D) = E + A/N^a + B/D^b is E + K_g C^(-a/2) at fraction g when a = b, so the
fraction moves mostly the scale. The exponent is still allowed to drift with ln g: on our ladder (bench/
ladder.py) the rungs' spread early in training (warmup, a loss far from its floor) and late (the floor
near) is not one power of compute, and one exponent for all fractions fitted the early ones and missed
the target by +0.17 nats on average. With (E, a0, a1) given, each A_g is the least-squares scale in
closed form: the target's excess loss at g is a positive blend of the rungs' excess losses at g, with
weights that move smoothly with g, so its projection falls with compute as the rungs' losses do and
rises only where theirs do (warmup, a schedule that ends). That is a property of the fit, not a
proof: the bench counts the projections that rise from one fraction to the next. One law per fraction
(`runledger.training.ladder_fit.forecast`) refits E and the exponent at each fraction on its own noise.

The fit: (E, a0, a1) on a grid (E over [e_min, min loss), a0 log-spaced over ALPHA_RANGE, a1 over
A1_GRID), every A_g profiled out, then Nelder-Mead from the grid's best point in each of STARTS bands of E. The band: the
rungs are the independent units (a rung off the law is off at every fraction, so its 20 readings are
not 20 observations), so it is the min/max of the leave-one-rung-out projections and the full fit's,
widened to a JOINT_BAND_LEVEL (95%) jackknife interval (t(n-1) standard errors, as the fixed-E per-fraction
band) times JOINT_CALIBRATION, and floored at the rungs' own scatter about the law; bench/ladder_oos.py
measures its coverage out of sample. A fraction at which the rungs cannot be read (non-finite, one loss on
every rung) is refused on its own; the others fit without it; rungs with one loss curve are refused. A
fixed E is checked against E fitted too (`check_fixed_E`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize

from runledger.training.ladder_fit import (JACKKNIFE_LEVEL, FRACTIONS, Curve, Forecast, Law, check_curve, check_curves_differ,
                                          check_points,
                                          jackknife_half, loss_at, reversed_at, reversed_flag)

ALPHA_RANGE = (1e-3, 3.0)  # the exponent's search range (Chinchilla's in C: 0.15; toy ladders: up to ~1)
GRID = 81  # points per axis of E and a0 on the grid the refinement starts from
JOINT_BAND_LEVEL = JACKKNIFE_LEVEL  # the band's nominal coverage: a t(n-1) jackknife interval (ladder_fit)...
# ...times JOINT_CALIBRATION. With 4 rungs the leave-one-out fits (3 rungs each, for 3 shared unknowns) can all
# agree on a law the rungs' offsets tilted, so the t(3) interval alone held the truth in ~90% of draws, not 95%:
# the 95th percentile of |error| / half-width was 1.55 (in-sample law) and 1.51-1.59 (the data-term law), at
# 0.5-2% noise, fractions 25% and 100%, seeds 0..39 (issue 45; `python -m bench.ladder_oos` checks it on
# other seeds). 1.6, from the in-sample law, is the least factor that brings the band to its level there.
JOINT_CALIBRATION = 1.6
MIN_RUNGS_FIT_E = 3  # E, the exponent and a scale: fewer rungs cannot separate them at one fraction


@dataclass(frozen=True)
class Readings:
    """The rungs read at fractions: Y[i, j] is rung i's loss at fractions[j]; flags[j] name extrapolations."""

    names: list[str]
    planned_flops: np.ndarray  # [n]
    fractions: list[float]
    Y: np.ndarray  # [n, m]
    flags: list[list[str]]


def read_rungs(curves: list[Curve], fractions, refusals: dict[float, str] | None = None) -> Readings:
    """Each rung's loss at each fraction (`loss_at`); a fraction the points cannot fit is refused (into
    `refusals`, with its one-line reason) and left out; a curve that cannot be read at all raises."""
    names = [c.name for c in curves]
    for c in curves:
        check_curve(c)
    C = np.array([c.planned_flops for c in curves], float)
    kept, cols, flags = [], [], []
    for g in fractions:
        read = [loss_at(c, g) for c in curves]
        L = np.array([y for y, _ in read])
        try:
            check_points(g * C, L, names, where=f" at {g:.0%}")
        except ValueError as err:
            if refusals is None:
                raise
            refusals[g] = str(err)
            continue
        kept.append(g)
        cols.append(L)
        flags.append([fl for _, fl in read if fl])
    if kept:
        check_curves_differ(curves)
    Y = np.stack(cols, 1) if cols else np.zeros((len(curves), 0))
    return Readings(names, C, kept, Y, flags)


def _sse(E: float, a0: float, a1: float, x: np.ndarray, lg: np.ndarray, Y: np.ndarray) -> float:
    """Squared error of the best scales A_g for E and the exponent a0 + a1 ln g, over every fraction.

    x: log planned compute of each rung, centred [n]; lg: ln g of each fraction [m]; Y: readings [n, m].
    With c_ig = exp(-alpha_g x_i), the least-squares fit of y_ig = L_ig - E by A_g c_ig leaves
    sum_i y^2 - (sum_i c y)^2 / sum_i c^2 per fraction (the fraction's own factor g^-alpha_g cancels)."""
    c = np.exp(-(a0 + a1 * lg)[None, :] * x[:, None])
    y = Y - E
    return float((y * y).sum() - (((c * y).sum(0)) ** 2 / (c * c).sum(0)).sum())


def _grid_sse(E: np.ndarray, a0: np.ndarray, a1: float, x: np.ndarray, lg: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """_sse on the grid E [p] x a0 [q] at one a1, vectorised: [p, q] (the search's starting points)."""
    c = np.exp(-(a0[:, None, None] + a1 * lg[None, None, :]) * x[None, :, None])  # [q, n, m]
    u = c / np.linalg.norm(c, axis=1, keepdims=True)
    y = Y[None, :, :] - E[:, None, None]  # [p, n, m]
    proj = np.einsum("qnm,pnm->pqm", u, y)
    return (y**2).sum((1, 2))[:, None] - (proj**2).sum(2)


A1_GRID = np.linspace(-0.1, 0.3, 9)  # the exponent's drift per unit of ln g the search starts from
STARTS = 8  # Nelder-Mead runs, from the grid's best point in each of this many bands of E: the error has
# more than one valley in E (an E near 0 with a flat exponent, an E near the floor with a steep one)


def fit_exponent(C: np.ndarray, Y: np.ndarray, fractions, E: float | None = None,
                 e_min: float = 0.0) -> tuple[float, float, float, str | None]:
    """(E, a0, a1, bound): the shared E (or the given one) and the exponent alpha(g) = a0 + a1 ln g of
    least squared error over every fraction; `bound` names a parameter at an edge of its range."""
    x = np.log(C) - np.mean(np.log(C))
    lg = np.log(np.asarray(fractions, float))
    hi = float(Y.min())
    if E is None:
        if not hi > e_min:
            raise ValueError(f"min loss {hi} is not above the lower bound of E {e_min}")
        e_lo, e_hi = e_min, hi - 1e-6 * (hi - e_min)
        Es = np.linspace(e_lo, e_hi, GRID)
    else:
        if not hi > E:
            raise ValueError(f"every loss must be above E={E} (min loss {hi:.4f})")
        e_lo = e_hi = float(E)
        Es = np.array([float(E)])
    alphas = np.geomspace(*ALPHA_RANGE, GRID)
    grid = np.stack([_grid_sse(Es, alphas, a1, x, lg, Y) for a1 in A1_GRID], 2)  # [p, q, r]
    a_lo, a_hi = ALPHA_RANGE

    def unpack(v) -> tuple[float, float, float]:
        e = e_lo if E is not None else min(max(v[0], e_lo), e_hi)
        return e, v[-2], v[-1]

    def loss(v) -> float:
        e, a0, a1 = unpack(v)
        ends = (a0, a0 + a1 * lg.min())  # the exponent at g = 1 and at the earliest fraction
        if min(ends) < a_lo or max(ends) > a_hi:
            return math.inf
        return _sse(e, a0, a1, x, lg, Y)

    best = None
    bands = np.array_split(np.arange(len(Es)), min(STARTS, len(Es)))
    for band in bands:  # the grid's best point within each band of E
        i, j, k = np.unravel_index(int(np.argmin(grid[band])), grid[band].shape)
        i = int(band[i])
        start = [alphas[j], A1_GRID[k]] if E is not None else [Es[i], alphas[j], A1_GRID[k]]
        res = optimize.minimize(loss, start, method="Nelder-Mead",
                                options={"xatol": 1e-7, "fatol": 1e-12, "maxiter": 4000})
        if best is None or res.fun < best.fun:
            best = res
    e, a0, a1 = unpack(best.x)
    bound = None
    if E is None and (e - e_lo) <= 1e-6 * max(hi, 1):
        bound = f"E fitted at the bottom of its range ({e:.3g}): the rungs do not pin it"
    elif E is None and (e_hi - e) <= (Es[1] - Es[0]):
        bound = f"E fitted at the top of its range ({e:.3g}): the rungs do not pin it"
    elif min(a0, a0 + a1 * lg.min()) <= a_lo * 1.01 or max(a0, a0 + a1 * lg.min()) >= a_hi * 0.99:
        bound = f"the exponent ({a0:.3g} + {a1:.3g} ln g) at an end of its range {ALPHA_RANGE}: the rungs do not pin it"
    return e, float(a0), float(a1), bound


def excess_at(C: np.ndarray, y: np.ndarray, alpha: float, at: float) -> float:
    """A_g * at^-alpha, A_g the least-squares scale of y_i = A_g (C_i)^-alpha (computed in ratios to `at`)."""
    r = np.exp(-alpha * (np.log(C) - math.log(at)))
    return float(np.dot(r, y) / np.dot(r, r))


def rung_scatter(C: np.ndarray, y: np.ndarray, alpha: float) -> float:
    """The rungs' own scatter about the law at one reading: the RMS of y_i - A C_i^-alpha (A least
    squares), on n - 1 degrees of freedom (the scale is fitted)."""
    c = np.exp(-alpha * (np.log(C) - np.mean(np.log(C))))
    r = y - c * float(np.dot(c, y) / np.dot(c, c))
    return math.sqrt(float(np.dot(r, r)) / max(len(y) - 1, 1))


@dataclass
class JointFit:
    """One (E, a0, a1) over every fraction, and the same fitted without each rung (for the band)."""

    curves: list[Curve]
    readings: Readings
    E: float
    a0: float  # the exponent at fraction g is a0 + a1 ln g
    a1: float
    E_given: float | None
    loo: list[tuple[float, float, float] | None]  # per rung left out: (E, a0, a1), None where it could not fit
    flags: list[str] = field(default_factory=list)
    _cache: dict = field(default_factory=dict, repr=False)

    def read(self, g: float) -> tuple[np.ndarray, list[str]]:
        """The rungs' losses at fraction g and the extrapolation flags."""
        r = self.readings
        for j, f in enumerate(r.fractions):
            if abs(f - g) < 1e-12:
                return r.Y[:, j], r.flags[j]
        if g not in self._cache:
            read = [loss_at(c, g) for c in self.curves]
            L = np.array([y for y, _ in read])
            check_points(g * r.planned_flops, L, r.names, where=f" at {g:.0%}")
            self._cache[g] = (L, [fl for _, fl in read if fl])
        return self._cache[g]

    def forecast(self, target_flops: float, g: float, read_at: float | None = None) -> Forecast:
        """The target's loss at fraction g of `target_flops`, from the rungs read at `read_at` (default g):
        the projection, the leave-one-rung-out band, the law at g (A its scale there)."""
        if not (math.isfinite(target_flops) and target_flops > 0):
            raise ValueError(f"target compute {target_flops:g} FLOPs is not positive")
        read_at = g if read_at is None else read_at
        L, flags = self.read(read_at)
        C = read_at * self.readings.planned_flops
        at = g * target_flops
        lg = math.log(read_at)
        alpha = self.a0 + self.a1 * lg
        excess = excess_at(C, L - self.E, alpha, at)
        projected = self.E + excess
        loo = []
        for i, fit in enumerate(self.loo):
            if fit is None:
                continue
            keep = np.arange(len(L)) != i
            e, a0, a1 = fit
            loo.append(e + excess_at(C[keep], L[keep] - e, a0 + a1 * lg, at))
        flags = [*self.flags, *flags]
        rev = reversed_flag(C, L, read_at)
        if rev:
            flags.append(rev)
        low, high = min([projected, *loo]), max([projected, *loo])
        level = None
        if len(loo) >= 2:
            half = JOINT_CALIBRATION * jackknife_half(loo, JOINT_BAND_LEVEL)
            scatter = rung_scatter(C, L - self.E, alpha)
            if half < scatter:  # narrower than the rungs' own scatter about the law: a fit artefact
                flags.append(f"band floored at the rungs' own scatter about the law at {read_at:.0%} "
                             f"(+-{scatter:.3g}; the jackknife gave +-{half:.3g})")
                half = scatter
            low, high = min(low, projected - half), max(high, projected + half)
            level = JOINT_BAND_LEVEL
        low = max(low, min(0.0, projected))  # a loss (a cross-entropy) is not below 0 nats
        if excess <= 0:
            flags.append(f"the rungs' loss does not fall with compute at {read_at:.0%}: no positive scale A")
        A = excess * math.exp(alpha * math.log(at))
        if not all(math.isfinite(v) for v in (projected, low, high, A)):
            raise ValueError(f"{', '.join(self.readings.names)}: the joint fit at {g:.0%} is not finite "
                             f"(projected {projected}, band [{low}, {high}])")
        return Forecast(fraction=g, target_flops=at, projected_loss=projected, band_low=low, band_high=high,
                        law=Law(E=self.E, A=A, alpha=alpha), rungs=list(self.readings.names), flags=flags,
                        points=[(float(c), float(y)) for c, y in zip(C, L)], band_level=level)


def fit_joint(curves: list[Curve], E: float | None = None, fractions=FRACTIONS,
              refusals: dict[float, str] | None = None) -> JointFit:
    """Fit one E (or take the given one) and one exponent over the rungs read at every fraction.

    Raises ValueError (one line) where the rungs cannot say: too few rungs, no fraction readable."""
    names = ", ".join(c.name for c in curves) or "no rung"
    if len(curves) < 2:
        raise ValueError(f"{names}: a law needs at least 2 rungs, got {len(curves)}")
    if E is None and len(curves) < MIN_RUNGS_FIT_E:
        raise ValueError(f"{names}: E cannot be fitted from {len(curves)} rungs (E, A and alpha are 3 unknowns): "
                         "fix E or add rungs")
    readings = read_rungs(curves, fractions, refusals)
    if not readings.fractions:
        raise ValueError(f"{names}: no fraction of training can be read off the rungs")
    E_fit, a0, a1, bound = fit_exponent(readings.planned_flops, readings.Y, readings.fractions, E)
    rev = [g for j, g in enumerate(readings.fractions) if reversed_at(g * readings.planned_flops, readings.Y[:, j])]
    if len(rev) * 2 > len(readings.fractions):  # a reversed ladder, not a law the rungs do not pin
        bound = (f"reversed ladder: loss rises with compute across the rungs at {len(rev)} of "
                 f"{len(readings.fractions)} fractions")
    flags = [bound] if bound else []
    loo: list[tuple[float, float, float] | None] = []
    need = MIN_RUNGS_FIT_E if E is None else 2
    if len(curves) - 1 >= need:
        for i in range(len(curves)):
            keep = np.arange(len(curves)) != i
            try:
                e, b0, b1, _ = fit_exponent(readings.planned_flops[keep], readings.Y[keep], readings.fractions, E)
                loo.append((e, b0, b1))
            except ValueError as err:
                flags.append(f"leave-out {curves[i].name}: {err}")
                loo.append(None)
    else:
        flags.append(f"only {len(curves)} rungs: no leave-one-rung-out band")
    if E is not None:
        flags += check_fixed_E(readings, E)
    return JointFit(curves, readings, E_fit, a0, a1, E, loo, flags)


def check_fixed_E(readings: Readings, E: float) -> list[str]:
    """A fixed E, checked against the data: E fitted too (with every rung, and without each one for its
    jackknife interval at JOINT_BAND_LEVEL, calibrated as the band is); a flag with both values where the
    fixed one lies outside that interval. Nothing where the rungs are too few to fit E without one of them.
    (The readings' own squared error cannot judge it: a rung's offset is shared by its 20 readings, so an
    F-test on them rejected even the law's own E in most draws of bench/ladder_oos.py.)"""
    n = len(readings.names)
    if n - 1 < MIN_RUNGS_FIT_E:
        return []
    try:
        free = fit_exponent(readings.planned_flops, readings.Y, readings.fractions)[0]
        loo = [fit_exponent(readings.planned_flops[np.arange(n) != i], readings.Y[np.arange(n) != i],
                            readings.fractions)[0] for i in range(n)]
    except ValueError as err:
        return [f"E fixed at {E:.3g} could not be checked: E cannot be fitted ({err})"]
    half = JOINT_CALIBRATION * jackknife_half(loo, JOINT_BAND_LEVEL)
    if abs(E - free) <= half:
        return []
    return [f"the data reject the fixed E {E:.3g}: fitted, E is {free:.3g} (its {JOINT_BAND_LEVEL:.0%} interval "
            f"[{free - half:.3g}, {free + half:.3g}]); the forecast's band does not carry that error"]


def non_monotone(projections: list[float]) -> int:
    """How many times a projection rises from one fraction to the next (a law in compute only falls)."""
    return int(sum(b > a for a, b in zip(projections, projections[1:])))
