"""The ladder fitter on ladders drawn from a published law: how often its band holds the truth.

The law is Chinchilla's fitted L(N, D) = E + A / N^a + B / D^b (Hoffmann et al. 2022, approach 3:
E 1.69, A 406.4, B 410.7, a 0.34, b 0.28) at the compute-optimal split of C = 6 N D, which is exactly
L(C) = E + K * C^(-a*b/(a+b)), an exponent of 0.1535 in C. Each draw is a ladder of RUNGS rungs spread
evenly in log compute over DECADES decades from C0, every rung's loss off the law by NOISE (relative,
normal, one offset per rung: a seed's worth), read through `runledger.training.ladder_fit.forecast` at g = 1; the
target is TARGET_X times the last rung's compute. Draws use numpy seeds seed0..seed0+draws-1 (0..999
by default; `--seed0 1000` is a second, disjoint set).

    .venv/bin/python -m bench.ladder_law [--draws 1000] [--seed0 0] [--rungs 5] [--noise 0.005]

Prints, per way of fitting (E fitted, the default; E fixed at the old default 0.6; E fixed at the
law's own E), the coverage of the band, its median width, the median fitted exponent, and refusals.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np

from runledger.training.ladder_fit import BAND_LEVEL, DEFAULT_E, Curve, forecast

log = logging.getLogger("bench.ladder_law")

# Hoffmann et al. 2022 ("Chinchilla"), approach 3's fitted parametric loss
CH_E, CH_A, CH_B, CH_a, CH_b = 1.69, 406.4, 410.7, 0.34, 0.28
C0 = 1e18  # the smallest rung's FLOPs (a ~80M-parameter compute-optimal model)
DECADES = 2.0
TARGET_X = 10.0  # the target sits 10x beyond the last rung (issue 14)
POINTS = 21  # points per rung curve, over its last half (the fit reads g = 1 from them)
FPT = 1e9  # FLOPs per token of a synthetic rung: only the product tokens x FPT matters


def chinchilla(C) -> np.ndarray:
    """Chinchilla's loss at the compute-optimal N, D for compute C = 6 N D."""
    C = np.asarray(C, dtype=float)
    G = (CH_a * CH_A / (CH_b * CH_B)) ** (1 / (CH_a + CH_b))
    N = G * (C / 6) ** (CH_b / (CH_a + CH_b))
    D = C / (6 * N)
    return CH_E + CH_A * N ** -CH_a + CH_B * D ** -CH_b


EXPONENT = CH_a * CH_b / (CH_a + CH_b)


def ladder(rng: np.random.Generator, rungs: int, noise: float) -> list[Curve]:
    """Rung curves whose loss follows the law at the compute spent so far, each off it by one draw of noise."""
    out = []
    for i, C in enumerate(C0 * np.logspace(0, DECADES, rungs)):
        budget = C / FPT
        tokens = np.linspace(0.5 * budget, budget, POINTS)
        loss = chinchilla(tokens * FPT) * (1 + noise * rng.standard_normal())
        out.append(Curve(f"r{i}", tokens, loss, budget, FPT))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--seed0", type=int, default=0, help="the first numpy seed (draws use seed0..seed0+draws-1)")
    ap.add_argument("--rungs", type=int, default=5)
    ap.add_argument("--noise", type=float, default=0.005)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    target = C0 * 10**DECADES * TARGET_X
    truth = float(chinchilla(target))
    log.info("law: Chinchilla L(N,D) at C = 6ND, L(C) = %.2f + K C^-%.4f; %d rungs over %g decades from %.0e "
             "FLOPs, %.1f%% noise; target %.0e FLOPs (%gx the last rung), true loss %.4f; band level %.0f%%; "
             "seeds %d..%d", CH_E, EXPONENT, args.rungs, DECADES, C0, 100 * args.noise, target, TARGET_X, truth,
             100 * BAND_LEVEL, args.seed0, args.seed0 + args.draws - 1)
    t0 = time.perf_counter()
    print(f"{'E':>14} {'coverage':>9} {'refused':>8} {'band width':>11} {'|error|':>8} {'alpha':>7} {'flagged':>8}")
    for label, E in (("fitted", None), (f"fixed {DEFAULT_E}", DEFAULT_E), (f"fixed {CH_E}", CH_E)):
        hit, refused, widths, errors, alphas, flagged = 0, 0, [], [], [], 0
        for seed in range(args.seed0, args.seed0 + args.draws):
            curves = ladder(np.random.default_rng(seed), args.rungs, args.noise)
            try:
                f = forecast(curves, target, 1.0, E=E)
            except ValueError:
                refused += 1
                continue
            hit += f.band_low <= truth <= f.band_high
            widths.append(f.band_high - f.band_low)
            errors.append(abs(f.projected_loss - truth))
            alphas.append(f.law.alpha)
            flagged += bool(f.flags)
        n = args.draws - refused
        print(f"{label:>14} {hit / max(n, 1):>9.1%} {refused:>8} {np.median(widths):>11.4f} {np.median(errors):>8.4f} "
              f"{np.median(alphas):>7.4f} {flagged:>8}")
    log.info("true exponent %.4f; %d draws per row in %.1fs", EXPONENT, args.draws, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
