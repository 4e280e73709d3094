"""The ladder's loss forecast, pure numpy: fit L = E + A * C^(-alpha) over the rungs at one fraction g
of training (C = model FLOPs so far), project the target at g of its compute, and bound it.

Marin's recipe (DESIGN.md, "Forecast"): every rung is read at the same fraction g of its own schedule,
so that rungs and target are compared at the same point of their learning-rate schedules.

E is fitted by default, with the rest of the law: for each E below the lowest loss, A and alpha of
least squared error in the loss itself (a line through log(L - E) against log C weighted by
(L - E)^2, refined by Gauss-Newton); the E leaving the least squared error wins. The band is the profile
likelihood interval of the projection at BAND_LEVEL: every (E, A, alpha) whose squared error is within
the F-test's reach of the best, projected to the target, so it carries E's uncertainty with A's and
alpha's. Fewer rungs than that needs are said, never papered over: 2 rungs cannot fit E (refused), 3
fit it exactly and leave no residual to size a band (the band then spans every E, and says so).

A fixed E (`E=0.6`; Marin fixes 1.5) is the option: A and alpha by polyfit of log(L - E) on log C
(Marin's fit), and the band is the min/max of the leave-one-rung-out projections, widened to include
the full fit's and a JACKKNIFE_LEVEL (95%) t(n-1) jackknife interval around it. That band knows nothing of E.
Every forecast states its band's nominal level (`Forecast.band_level`; None where nothing sizes it).

What the fitter cannot know it refuses in one line naming the rung (a non-finite loss, compute that
is not positive, the same loss on every rung, too few rungs for the unknowns) or flags on the forecast
(E at a bound of its range, alpha <= 0, a rung extrapolated); it never returns NaN.

A rung that died partway is kept: its loss past the point it reached is extrapolated from the last
20% of what it did (a line of loss against log compute) and flagged. The self-check extrapolates
each finished rung's 60-80% window to its own end with that same tail method; the worst error is
part of every forecast's record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

# Default irreducible loss for our byte-level models, in nats per byte. Marin fixes E = 1.5 nats per
# *token* of a ~128k-token vocabulary; a byte carries far less. Shannon (1951) puts printed English at
# about 1 bit per character (0.69 nats); Python source and the generated arithmetic lines of
# `runledger.training.data` are more predictable than prose, so the floor of the mixture sits a little below.
DEFAULT_E = 0.6  # the fixed-E option's value (the default is to fit E)

FRACTIONS = tuple(round(0.05 * i, 2) for i in range(1, 21))  # every 5% of training (Marin's checklist)
TAIL = 0.2  # a crashed rung is extrapolated from the last 20% of what it reached
SELF_CHECK_WINDOW = (0.6, 0.8)  # ...and the method is checked by extrapolating 60-80% to 100%
# The band of a fixed E (and of the joint fit, `ladder_joint`): the leave-one-rung-out projections
# (Marin), widened to a JACKKNIFE_LEVEL interval: t(n-1) jackknife standard errors either side. The bare
# min/max of n leave-one-out fits understates the estimate's spread by about sqrt(n-1) (the jackknife's
# variance is (n-1)/n * sum of squared deviations); and with 4 rungs the standard error is itself read off
# 3 degrees of freedom, so +-2 of them (95% if it were known) held the truth in ~85% of draws out of sample
# (issue 45); Student's t(3) at 97.5%, 3.18, is the quantile such a ratio follows (bench/ladder_oos.py).
JACKKNIFE_LEVEL = 0.95


def jackknife_half(loo, level: float = JACKKNIFE_LEVEL) -> float:
    """Half the width of the jackknife interval at `level` from n >= 2 leave-one-out estimates:
    t(n-1) quantile x sqrt((n-1)/n * sum of squared deviations)."""
    v = np.asarray(loo, dtype=float)
    n = len(v)
    se = math.sqrt((n - 1) / n * float(np.sum((v - v.mean()) ** 2)))
    return float(stats.t.ppf((1 + level) / 2, n - 1)) * se


# The band when E is fitted: a 90% profile-likelihood interval. Issue 14's yardstick: on ladders drawn
# from Chinchilla's law (5 rungs over 2 decades, 0.5% noise) it should hold the truth at 10x beyond the
# last rung in about 90% of draws (bench/ladder_law.py measures it).
BAND_LEVEL = 0.90
E_GRID = 2001  # E's profile is read on this many points of [e_min, min loss)
# losses closer than this (relative) on every rung are "the same loss": identical rung curves read through
# each rung's own window of steps differ by the reading's rounding (7e-7 apart on one such ladder, issue 45),
# far below any real ladder's spread (rungs 2x apart in compute differ by 1e-2 or more)
FLAT_REL = 1e-5
SMOOTH = 0.05  # a rung's loss at g: a line through its steps within +-5% of training of g, read at g
MIN_POINTS = 5  # ...and through at least this many steps (a 12-step rung has 1 within +-5%)
# ...a parabola in log tokens where the window spans more than this in ln tokens (the first fractions: at 5%
# the +-5% window spans 0-10% of training, where a line through the convex first steps read +0.3% to +0.9%
# high on the laws of bench/ladder_oos.py; the parabola -0.02% to -0.1%)
CURVED_SPAN = 0.5


@dataclass(frozen=True)
class Law:
    """L(C) = E + A * C^(-alpha)."""

    E: float
    A: float
    alpha: float

    def loss(self, compute) -> np.ndarray | float:
        return self.E + self.A * np.power(np.asarray(compute, dtype=float), -self.alpha)

    def as_dict(self) -> dict[str, float]:
        return {"E": float(self.E), "A": float(self.A), "alpha": float(self.alpha)}


@dataclass(frozen=True)
class Curve:
    """One rung's training loss against its tokens seen, and the compute it was planned for.

    `tokens` and `loss` are aligned arrays (steps with no finite loss left out); `complete` is False
    for a rung that stopped before its planned token budget.
    """

    name: str
    tokens: np.ndarray
    loss: np.ndarray
    token_budget: float
    flops_per_token: float
    complete: bool = True

    @property
    def planned_flops(self) -> float:
        return self.token_budget * self.flops_per_token

    @property
    def reached(self) -> float:
        """The fraction of its planned tokens this rung reached."""
        return float(self.tokens[-1]) / self.token_budget if len(self.tokens) else 0.0


@dataclass(frozen=True)
class Forecast:
    fraction: float
    target_flops: float
    projected_loss: float
    band_low: float
    band_high: float
    law: Law
    rungs: list[str]
    flags: list[str] = field(default_factory=list)
    points: list[tuple[float, float]] = field(default_factory=list)  # (C, L) of each rung at this g
    band_level: float | None = None  # the band's nominal coverage (None: nothing sizes it; flags say why)


def check_points(C, L, names: list[str] | None = None, where: str = "") -> None:
    """Refuse, in one line naming the rung, points no law can be fitted to."""
    names = names or [f"point {i}" for i in range(len(C))]
    for name, c, y in zip(names, C, L):
        if not math.isfinite(y):
            raise ValueError(f"{name}: loss{where} is {y} (not finite): no law through it")
        if not (math.isfinite(c) and c > 0):
            raise ValueError(f"{name}: compute{where} is {c:g} FLOPs (not positive): no law through it")
    if len(L) >= 2 and np.ptp(L) <= FLAT_REL * np.max(np.abs(L)):
        raise ValueError(f"{', '.join(names)}: the same loss {L[0]:.6g} on every rung{where}: compute does not "
                         "move it, so no law can be fitted")


def reversed_at(C, L) -> float | None:
    """The slope of loss on ln compute across the rungs where it is positive (loss rises with compute: a
    reversed ladder, which no falling law fits), else None."""
    x = np.log(np.asarray(C, dtype=float))
    if len(x) < 2 or np.ptp(x) == 0:
        return None
    slope = float(np.polyfit(x, np.asarray(L, dtype=float), 1)[0])
    return slope if slope > 0 else None


def reversed_flag(C, L, g: float) -> str | None:
    slope = reversed_at(C, L)
    if slope is None:
        return None
    return (f"reversed ladder at {g:.0%}: loss rises with compute across the rungs ({slope:+.3g} per e-fold of "
            "compute); the law's E and exponent there say nothing")


def check_curves_differ(curves: list["Curve"]) -> None:
    """Refuse rungs whose loss curves, as functions of the fraction of training, are one curve: compute does
    not move the loss. Read at a fraction through windows of different step counts, identical curves
    differ by the windows' rounding (up to 1e-3 of the loss), which no tolerance on the readings separates
    from a real ladder's spread; the curves themselves are compared, each on the others' fractions."""
    if len(curves) < 2 or any(len(c.tokens) < 2 for c in curves):
        return
    base = min(curves, key=lambda c: len(c.tokens))
    fb = base.tokens / base.token_budget
    scale = float(np.max(np.abs(base.loss))) or 1.0
    for c in curves:
        fc = c.tokens / c.token_budget
        inside = (fb >= fc[0]) & (fb <= fc[-1])
        if inside.sum() < 2 or np.max(np.abs(np.interp(fb[inside], fc, c.loss) - base.loss[inside])) > FLAT_REL * scale:
            return
    raise ValueError(f"{', '.join(c.name for c in curves)}: the same loss curve on every rung (as a function of the "
                     "fraction of training): compute does not move it, so no law can be fitted")


def fit_law(compute, loss, E: float | None = None, e_min: float = 0.0) -> Law:
    """Fit L = E + A * C^(-alpha): with `E` None (the default) E too, bounded to [e_min, min(L)), by
    profile (`profile_E`); with E fixed, A and alpha by polyfit of log(L - E) on log C (Marin's fit)."""
    C, L = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    if len(C) < 2:
        raise ValueError(f"a law needs at least 2 points, got {len(C)}")
    check_points(C, L)
    if E is not None:
        return _fit_fixed(C, L, E)
    return profile_E(C, L, e_min).law


def _fit_fixed(C: np.ndarray, L: np.ndarray, E: float) -> Law:
    gap = L - E
    if np.any(gap <= 0):
        raise ValueError(f"every loss must be above E={E} (min loss {L.min():.4f})")
    slope, intercept = np.polyfit(np.log(C), np.log(gap), 1)
    return Law(E=float(E), A=float(math.exp(intercept)), alpha=float(-slope))


@dataclass(frozen=True)
class Profile:
    """E's profile: for each E on a grid, the best log(L - E) = a + b (log C - x0) and its squared error."""

    E: np.ndarray  # [m] the grid
    a: np.ndarray  # [m] intercept at log C = x0
    b: np.ndarray  # [m] slope (= -alpha)
    sse: np.ndarray  # [m] squared error in L
    inv: np.ndarray  # [m, 2, 2] (J'J)^-1, J the Jacobian of the fit in (a, b): the error's curvature
    x0: float
    best: int  # index of the least error
    n: int

    @property
    def law(self) -> Law:
        i = self.best
        return Law(E=float(self.E[i]), A=float(math.exp(self.a[i] - self.b[i] * self.x0)), alpha=float(-self.b[i]))

    @property
    def at_bound(self) -> bool:
        return self.best in (0, len(self.E) - 1)

    def band(self, compute: float, level: float = BAND_LEVEL) -> tuple[float, float, bool]:
        """(low, high, sized): the projection's profile-likelihood interval at `level`. With no residual
        degree of freedom (3 points) nothing sizes it: every E's projection, and sized False."""
        x = math.log(compute) - self.x0
        z = self.a + self.b * x
        dof = self.n - 3
        if dof <= 0:
            proj = self.E + np.exp(z)
            return float(proj.min()), float(proj.max()), False
        f = stats.t.ppf((1 + level) / 2, dof) ** 2  # F(1, dof) at `level`: one function of the parameters
        thr = self.sse[self.best] * (1 + f / dof)
        inside = self.sse <= thr
        q = self.inv[:, 0, 0] + 2 * x * self.inv[:, 0, 1] + x * x * self.inv[:, 1, 1]
        half = np.sqrt(np.clip(thr - self.sse, 0, None) * q)
        low = self.E + np.exp(z - half)
        high = self.E + np.exp(z + half)
        return float(low[inside].min()), float(high[inside].max()), True


def profile_E(C, L, e_min: float = 0.0, points: int = E_GRID) -> Profile:
    """E on `points` values of [e_min, min L); at each, A and alpha of least squared error in L: from the
    line through log(L - E) on log C weighted by (L - E)^2, refined by Gauss-Newton. Needs 3 points."""
    C, L = np.asarray(C, dtype=float), np.asarray(L, dtype=float)
    if len(C) < 3:
        raise ValueError(f"E cannot be fitted from {len(C)} points (E, A and alpha are 3 unknowns): fix E or add rungs")
    hi = float(L.min())
    if not hi > e_min:
        raise ValueError(f"min loss {hi} is not above the lower bound of E {e_min}")
    E = np.linspace(e_min, hi - 1e-6 * (hi - e_min), points)
    x0 = float(np.mean(np.log(C)))
    x = np.log(C) - x0
    gap = L[None, :] - E[:, None]
    z, w = np.log(gap), gap**2
    sw, sx, sxx = w.sum(1), (w * x).sum(1), (w * x * x).sum(1)
    sz, sxz = (w * z).sum(1), (w * x * z).sum(1)
    det = sw * sxx - sx**2
    b = (sw * sxz - sx * sz) / det
    a = (sz - b * sx) / sw
    # ...then Gauss-Newton on the squared error in L itself (the weighting is only first-order: near
    # E = min L it would let the lowest rung's error vanish and make a false minimum there)
    sse, inv = _loss_sse(E, a, b, x, L)
    for _ in range(GN_STEPS):
        f = np.exp(a[:, None] + b[:, None] * x)
        r = E[:, None] + f - L[None, :]
        g0, g1 = (f * r).sum(1), (f * x * r).sum(1)  # J'r with J = [f, f x]
        step_a = -(inv[:, 0, 0] * g0 + inv[:, 0, 1] * g1)
        step_b = -(inv[:, 1, 0] * g0 + inv[:, 1, 1] * g1)
        a2, b2 = a + step_a, b + step_b
        sse2, inv2 = _loss_sse(E, a2, b2, x, L)
        better = np.isfinite(sse2) & (sse2 < sse)
        a, b = np.where(better, a2, a), np.where(better, b2, b)
        sse, inv = np.where(better, sse2, sse), np.where(better[:, None, None], inv2, inv)
    return Profile(E, a, b, sse, inv, x0, int(np.argmin(sse)), len(C))


GN_STEPS = 8  # Gauss-Newton steps from the weighted line (it starts close: a few suffice)


def _loss_sse(E, a, b, x, L) -> tuple[np.ndarray, np.ndarray]:
    """Per E: the squared error in L of E + exp(a + b x), and (J'J)^-1 of its Jacobian in (a, b)."""
    f = np.exp(a[:, None] + b[:, None] * x)
    sse = ((E[:, None] + f - L[None, :]) ** 2).sum(1)
    j00, j01, j11 = (f * f).sum(1), (f * f * x).sum(1), (f * f * x * x).sum(1)
    det = j00 * j11 - j01**2
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.stack([np.stack([j11, -j01], 1), np.stack([-j01, j00], 1)], 1) / det[:, None, None]
    return sse, inv


def tail_line(x, y) -> tuple[float, float]:
    """(a, b) of y = a + b * log(x): the line a crashed rung's tail is extrapolated along."""
    b, a = np.polyfit(np.log(np.asarray(x, dtype=float)), np.asarray(y, dtype=float), 1)
    return float(a), float(b)


def loss_at(curve: Curve, g: float) -> tuple[float, str | None]:
    """The rung's loss at fraction g of its planned tokens, and a flag when it was extrapolated.

    Reached: a line of loss against log tokens through the rung's points within `SMOOTH` of training
    either side of g (at least `MIN_POINTS`), read at g: the rung is finished, so the points after g are
    known, and a centred line smooths step noise without a trailing mean's lag. Not reached (the
    rung died): the line through the last `TAIL` of what it did, read at g, and flagged.
    """
    at = g * curve.token_budget
    t, y = curve.tokens, curve.loss
    if len(t) == 0:
        raise ValueError(f"rung {curve.name} has no finite losses")
    if t[-1] >= at:
        idx = np.flatnonzero(np.abs(t - at) <= SMOOTH * curve.token_budget)
        if len(idx) < MIN_POINTS:  # a short rung: its MIN_POINTS steps nearest to g
            idx = np.sort(np.argsort(np.abs(t - at), kind="stable")[:MIN_POINTS])
        if len(idx) < 2 or t[idx[0]] == t[idx[-1]]:
            return float(np.mean(y[idx])), None
        lt = np.log(t[idx]) - math.log(at)
        if len(idx) >= MIN_POINTS and lt[0] < 0 < lt[-1] and lt[-1] - lt[0] > CURVED_SPAN:
            return float(np.polyfit(lt, y[idx], 2)[-1]), None
        a, b = tail_line(t[idx], y[idx])
        return a + b * math.log(at), None
    a, b = tail_line(*_tail(curve, TAIL))
    return a + b * math.log(at), f"{curve.name}: extrapolated from {curve.reached:.0%} to {g:.0%} (last {TAIL:.0%})"


def _tail(curve: Curve, share: float) -> tuple[np.ndarray, np.ndarray]:
    end = float(curve.tokens[-1])
    sel = curve.tokens >= end * (1 - share)
    if sel.sum() < 2:
        sel = np.zeros(len(curve.tokens), bool)
        sel[-2:] = True
    return curve.tokens[sel], curve.loss[sel]


def self_check(curves: list[Curve]) -> tuple[float | None, dict[str, float]]:
    """Extrapolate each finished rung's 60-80% window to its own end; (worst |error|, error per rung).

    The error is extrapolated minus observed end loss (the observed end read like any other point).
    """
    lo, hi = SELF_CHECK_WINDOW
    errors: dict[str, float] = {}
    for c in curves:
        if not c.complete:
            continue
        sel = (c.tokens >= lo * c.token_budget) & (c.tokens <= hi * c.token_budget)
        if sel.sum() < 2:
            continue
        a, b = tail_line(c.tokens[sel], c.loss[sel])
        observed, _ = loss_at(c, 1.0)
        errors[c.name] = a + b * math.log(c.token_budget) - observed
    worst = max((abs(e) for e in errors.values()), default=None)
    return worst, errors


def check_curve(c: Curve) -> None:
    """Raise ValueError (one line, naming the rung) unless `c` has a positive planned compute and finite
    losses at finite token counts."""
    if not (math.isfinite(c.planned_flops) and c.planned_flops > 0):
        raise ValueError(f"{c.name}: planned compute {c.planned_flops:g} FLOPs is not positive: no law through it")
    bad = np.flatnonzero(~np.isfinite(c.loss) | ~np.isfinite(c.tokens))
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"{c.name}: loss {c.loss[i]} at {c.tokens[i]:g} tokens (not finite): a curve holds "
                         "finite losses only (a skipped step is left out)")

def forecast(curves: list[Curve], target_flops: float, g: float, E: float | None = None) -> Forecast:
    """The target's projected loss at fraction g of its compute `target_flops`, from the rungs at g.

    `E` None (the default): fitted, the band its profile interval. A number: fixed, the band leave-one-out.
    Raises ValueError (one line, naming the rung) where the rungs cannot say."""
    if not (math.isfinite(target_flops) and target_flops > 0):
        raise ValueError(f"target compute {target_flops:g} FLOPs is not positive")
    points, flags = [], []
    for c in curves:
        check_curve(c)
        y, flag = loss_at(c, g)
        points.append((g * c.planned_flops, y))
        if flag:
            flags.append(flag)
    names = [c.name for c in curves]
    C = np.array([p[0] for p in points])
    L = np.array([p[1] for p in points])
    if len(C) < 2:
        raise ValueError(f"{', '.join(names) or 'no rung'}: a law needs at least 2 rungs, got {len(C)}")
    check_points(C, L, names, where=f" at {g:.0%}")
    check_curves_differ(curves)
    at = g * target_flops
    if E is None:
        if len(C) < 3:
            raise ValueError(f"{', '.join(names)}: E cannot be fitted from {len(C)} rungs (E, A and alpha are 3 "
                             "unknowns): fix E or add rungs")
        prof = profile_E(C, L)
        law = prof.law
        projected = float(law.loss(at))
        low, high, sized = prof.band(at)
        low, high = min(low, projected), max(high, projected)
        level = BAND_LEVEL if sized else None
        if not sized:
            flags.append(f"E fitted from {len(C)} rungs: no residual left to size the band; it spans every E "
                         f"in [0, {L.min():.3g})")
        rev = reversed_flag(C, L, g)
        if rev:
            flags.append(rev)
        elif prof.at_bound:
            flags.append(f"E fitted at the {'top' if prof.best else 'bottom'} of its range ({law.E:.3g}): "
                         "the rungs do not pin it")
    else:
        law = fit_law(C, L, E)
        projected = float(law.loss(at))
        loo = []
        if len(curves) >= 3:
            for i in range(len(curves)):
                keep = np.arange(len(curves)) != i
                try:
                    loo.append(float(fit_law(C[keep], L[keep], E).loss(at)))
                except ValueError as err:
                    flags.append(f"leave-out {curves[i].name}: {err}")
        else:
            flags.append(f"only {len(curves)} rungs: no leave-one-rung-out band")
        low, high = min([projected, *loo]), max([projected, *loo])
        level = None
        if len(loo) >= 2:  # the jackknife: n leave-one-out fits spread ~1/sqrt(n-1) of the estimate's error
            half = jackknife_half(loo)
            low, high = min(low, projected - half), max(high, projected + half)
            level = JACKKNIFE_LEVEL
    if law.alpha <= 0:
        flags.append(f"alpha {law.alpha:.3g} <= 0: loss does not fall with compute at {g:.0%}")
    if not all(math.isfinite(v) for v in (projected, low, high, law.A, law.alpha)):
        raise ValueError(f"{', '.join(names)}: the fit at {g:.0%} is not finite (projected {projected}, "
                         f"band [{low}, {high}])")
    return Forecast(fraction=g, target_flops=at, projected_loss=projected, band_low=low, band_high=high, law=law,
                    rungs=names, flags=flags, points=points, band_level=level)
