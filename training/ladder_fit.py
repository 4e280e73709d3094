"""The ladder's loss forecast, pure numpy: fit L = E + A * C^(-alpha) over the rungs at one fraction g
of training (C = model FLOPs so far), project the target at g of its compute, and bound it with
leave-one-rung-out fits.

Marin's recipe (DESIGN.md, "Forecast"): every rung is read at the same fraction g of its own schedule,
so that rungs and target are compared at the same point of their learning-rate schedules; E is fixed
by config (Marin fixes 1.5) or fitted within bounds; A and alpha come from a straight line through
log(L - E) against log C (polyfit). The band is the min/max of the leave-one-rung-out projections,
widened to include the full fit's and +-2 jackknife standard errors around it. A rung that died
partway is kept: its loss past the point it reached is extrapolated from the last 20% of what it did
(a line of loss against log compute) and flagged. The self-check extrapolates each finished rung's
60-80% window to its own end with that same tail method; the worst error is part of every
forecast's record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

# Default irreducible loss for our byte-level models, in nats per byte. Marin fixes E = 1.5 nats per
# *token* of a ~128k-token vocabulary; a byte carries far less. Shannon (1951) puts printed English at
# about 1 bit per character (0.69 nats); Python source and the generated arithmetic lines of
# `training.data` are more predictable than prose, so the floor of the mixture sits a little below.
DEFAULT_E = 0.6

FRACTIONS = tuple(round(0.05 * i, 2) for i in range(1, 21))  # every 5% of training (Marin's checklist)
TAIL = 0.2  # a crashed rung is extrapolated from the last 20% of what it reached
SELF_CHECK_WINDOW = (0.6, 0.8)  # ...and the method is checked by extrapolating 60-80% to 100%
# The band: the leave-one-rung-out projections (Marin), widened to +-2 jackknife standard errors. The
# bare min/max of n leave-one-out fits understates the estimate's spread by about sqrt(n-1) (the
# jackknife's variance is (n-1)/n * sum of squared deviations): on curves drawn from a known law with
# 1% noise it held the truth ~50% of the time, the widened band ~85% (tests/test_ladder_fit.py).
BAND_SE = 2.0
SMOOTH = 0.05  # a rung's loss at g: a line through its steps within +-5% of training of g, read at g
MIN_POINTS = 5  # ...and through at least this many steps (a 12-step rung has 1 within +-5%)


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


def fit_law(compute, loss, E: float | None = DEFAULT_E, e_min: float = 0.0) -> Law:
    """Fit L = E + A * C^(-alpha): A, alpha by polyfit of log(L - E) on log C (Marin's fit).

    With `E` None, E is fitted too, bounded to [e_min, min(L)): the E whose log-space line leaves the
    smallest squared error in loss, found on a grid and refined by golden-section search.
    """
    C, L = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    if len(C) < 2:
        raise ValueError(f"a law needs at least 2 points, got {len(C)}")
    if E is not None:
        return _fit_fixed(C, L, E)
    hi = float(L.min())
    if not hi > e_min:
        raise ValueError(f"min loss {hi} is not above the lower bound of E {e_min}")
    margin = 1e-3 * (hi - e_min)

    def sse(e: float) -> float:
        law = _fit_fixed(C, L, e)
        return float(np.sum((law.loss(C) - L) ** 2))

    grid = np.linspace(e_min, hi - margin, 64)
    errs = [sse(e) for e in grid]
    i = int(np.argmin(errs))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    invphi = (math.sqrt(5) - 1) / 2
    c, d = b - invphi * (b - a), a + invphi * (b - a)
    for _ in range(40):
        if sse(c) < sse(d):
            b, d = d, c
            c = b - invphi * (b - a)
        else:
            a, c = c, d
            d = a + invphi * (b - a)
    best = min((grid[i], (a + b) / 2), key=sse)
    return _fit_fixed(C, L, float(best))


def _fit_fixed(C: np.ndarray, L: np.ndarray, E: float) -> Law:
    gap = L - E
    if np.any(gap <= 0):
        raise ValueError(f"every loss must be above E={E} (min loss {L.min():.4f})")
    slope, intercept = np.polyfit(np.log(C), np.log(gap), 1)
    return Law(E=float(E), A=float(math.exp(intercept)), alpha=float(-slope))


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


def forecast(curves: list[Curve], target_flops: float, g: float, E: float | None = DEFAULT_E) -> Forecast:
    """The target's projected loss at fraction g of its compute `target_flops`, from the rungs at g."""
    points, flags = [], []
    for c in curves:
        y, flag = loss_at(c, g)
        points.append((g * c.planned_flops, y))
        if flag:
            flags.append(flag)
    C = np.array([p[0] for p in points])
    L = np.array([p[1] for p in points])
    at = g * target_flops
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
    if len(loo) >= 2:  # the jackknife: n leave-one-out fits spread ~1/sqrt(n-1) of the estimate's error
        n = len(loo)
        se = math.sqrt((n - 1) / n * float(np.sum((np.array(loo) - np.mean(loo)) ** 2)))
        low, high = min(low, projected - BAND_SE * se), max(high, projected + BAND_SE * se)
    if law.alpha <= 0:
        flags.append(f"alpha {law.alpha:.3g} <= 0: loss does not fall with compute at {g:.0%}")
    return Forecast(fraction=g, target_flops=at, projected_loss=projected, band_low=low, band_high=high, law=law, rungs=[c.name for c in curves], flags=flags,
                    points=points)
