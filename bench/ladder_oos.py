"""The ladder's forecasts out of sample: how often every band holds the truth of a law the fitter was
not built on, at every 5% of training, beside the in-sample law (issue 45).

Two laws, each drawn as whole rung curves (every step of training, read by the fitter at each fraction):
  in_sample  Chinchilla's L(N, D) at the compute-optimal split of C = 6ND, so L(C) = E + K C^-0.1535,
             and a rung's loss at any point is that law at the compute spent so far: exactly the
             fitters' form (`bench/ladder_law.py`'s law, with whole curves instead of their last half).
  data_term  Chinchilla's L(N, D) = E + A / N^a + B / D^b itself (Hoffmann et al. 2022, approach 3:
             E 1.69, A 406.4, B 410.7, a 0.34, b 0.28) with every model at one ratio of tokens per
             parameter (TPP) and its size fixed while it trains: at fraction g a rung is
             E + A' C^-a/2 + B' g^-b C^-b/2, two powers of compute with a separate data term, which no
             fit of the form E + A_g C^-alpha(g) holds exactly.
The ladder is the project's own geometry: RUNGS rungs evenly in log compute over DECADES decades from C0,
the target TARGET_X times the last rung; each rung off its law by one relative normal offset (a seed's
worth of noise) at 0.5%, 1% and 2%. Draw k of a row uses numpy seed seed0 + k, the same draws for every
way of fitting.

Rows, per law and noise, per fraction (20) and pooled:
  joint            the default: one E over every fraction (`ladder_joint`), its band at its level
  per_fraction     a law per fraction (`ladder_fit.forecast`), its profile band at its level
  joint E-0.32     the joint fit given E 0.32 below the law's (point 2 of the issue): the flag that
                   the data reject it is what is measured ("flagged": of the misses; "fired": of all points)
  joint E=law      the same given the law's own E 1.69: how often that flag fires on a right E
  shorten          the revision of a plan cut to SHORTEN of its horizon by a decision at 10% (point 4)
  lengthen         the revision of a plan lengthened to LENGTHEN of its horizon (point 5): the points
                   past the registered horizon are the extrapolation measured apart ("lengthen>H")
Each: coverage with its 95% (Wilson) interval, truths above / below the band, bias (mean projection
minus truth), median band width, the share of misses a flag marks, and the share of all points it marks
(joint, per_fraction: any flag; E rows: "the data reject the fixed E"; revisions: the expected-error and
extrapolation flags). A rung's offset is shared by its 20 readings, so a draw tends to hit or miss at
every fraction at once: the draws, not the points, are the independent units.

    python -m bench.ladder_oos [--seeds 100] [--seed0 0] [--jobs 2] [--laws in_sample,data_term]
                               [--noise 0.005,0.01,0.02] [--per-fraction FILE.md]
"""

from __future__ import annotations

import argparse
import logging
import math
import multiprocessing
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from runledger.training.ladder_fit import BAND_LEVEL, FRACTIONS, Curve, forecast
from runledger.training.ladder_joint import JOINT_BAND_LEVEL, fit_joint

log = logging.getLogger("bench.ladder_oos")

CH_E, CH_A, CH_B, CH_a, CH_b = 1.69, 406.4, 410.7, 0.34, 0.28  # Hoffmann et al. 2022, approach 3
C0 = 1e18  # the smallest rung's FLOPs
RUNGS = 4
DECADES = 2.0
TARGET_X = 5.0  # the target about 5x beyond the last rung (issue 45's geometry)
TPP = 20.0  # tokens per parameter of every model of the data_term law (Chinchilla's rule of thumb)
STEPS = 200  # points per rung curve (its whole training)
TARGET_STEPS = 300  # the target's steps (for the plan changes' schedules)
WRONG_E = 0.32  # point 2: E fixed this far below the law's
SHORTEN, LENGTHEN = 0.4, 1.5  # points 4 and 5: the new horizon, a fraction of the registered one
DECIDED_AT = 0.1  # ...decided at this fraction of the registered plan (within the first 25%)


def chinchilla_opt(C) -> np.ndarray:
    """Chinchilla's loss at the compute-optimal N, D for compute C = 6 N D."""
    C = np.asarray(C, dtype=float)
    G = (CH_a * CH_A / (CH_b * CH_B)) ** (1 / (CH_a + CH_b))
    N = G * (C / 6) ** (CH_b / (CH_a + CH_b))
    return CH_E + CH_A * N ** -CH_a + CH_B * (C / (6 * N)) ** -CH_b


@dataclass(frozen=True)
class Model:
    """One model of a law: its FLOPs per token, token budget, and loss after t tokens (noise-free)."""

    fpt: float
    budget: float
    law: str

    def loss(self, tokens) -> np.ndarray:
        t = np.asarray(tokens, dtype=float)
        if self.law == "in_sample":
            return chinchilla_opt(t * self.fpt)
        N = self.fpt / 6
        return CH_E + CH_A * N ** -CH_a + CH_B * t ** -CH_b

    @property
    def flops(self) -> float:
        return self.fpt * self.budget


def model(law: str, flops: float) -> Model:
    if law == "in_sample":
        fpt = 1e9
        return Model(fpt, flops / fpt, law)
    N = math.sqrt(flops / (6 * TPP))
    return Model(6 * N, TPP * N, law)


def rungs(law: str, rng: np.random.Generator, noise: float) -> list[Curve]:
    out = []
    for i, C in enumerate(C0 * np.logspace(0, DECADES, RUNGS)):
        m = model(law, C)
        tokens = m.budget * np.arange(1, STEPS + 1) / STEPS
        out.append(Curve(f"r{i}", tokens, m.loss(tokens) * (1 + noise * rng.standard_normal()), m.budget, m.fpt))
    return out


def target(law: str) -> Model:
    return model(law, C0 * 10**DECADES * TARGET_X)


@dataclass
class Tally:
    """Per fraction: hits, truths above / below, errors, widths, misses flagged."""

    hit: dict = field(default_factory=dict)
    above: dict = field(default_factory=dict)
    below: dict = field(default_factory=dict)
    err: dict = field(default_factory=dict)
    width: dict = field(default_factory=dict)
    flagged: dict = field(default_factory=dict)
    fired: dict = field(default_factory=dict)  # the row's flag on any point, hit or miss
    refused: int = 0

    def add(self, g: float, truth: float, proj: float, low: float, high: float, flagged: bool) -> None:
        for d in (self.hit, self.above, self.below, self.err, self.width, self.flagged, self.fired):
            d.setdefault(g, [])
        self.fired[g].append(flagged)
        miss_above, miss_below = truth > high, truth < low
        self.hit[g].append(not (miss_above or miss_below))
        self.above[g].append(miss_above)
        self.below[g].append(miss_below)
        self.err[g].append(proj - truth)
        self.width[g].append(high - low)
        self.flagged[g].append(flagged and (miss_above or miss_below))

    def merge(self, other: "Tally") -> None:
        for name in ("hit", "above", "below", "err", "width", "flagged", "fired"):
            mine, theirs = getattr(self, name), getattr(other, name)
            for g, v in theirs.items():
                mine.setdefault(g, []).extend(v)
        self.refused += other.refused

    def row(self, gs=None) -> dict:
        gs = sorted(self.hit) if gs is None else [g for g in gs if g in self.hit]
        cat = lambda d: [x for g in gs for x in d[g]]  # noqa: E731
        hit = cat(self.hit)
        n, k = len(hit), int(sum(hit))
        misses = n - k
        lo, hi = wilson(k, n)
        return {"n": n, "coverage": k / n if n else math.nan, "ci": (lo, hi), "above": int(sum(cat(self.above))),
                "below": int(sum(cat(self.below))), "bias": float(np.mean(cat(self.err))) if n else math.nan,
                "width": float(np.median(cat(self.width))) if n else math.nan,
                "flagged": (sum(cat(self.flagged)) / misses) if misses else math.nan,
                "fired": float(np.mean(cat(self.fired))) if n else math.nan}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson interval of a proportion k / n."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return mid - half, mid + half


def draw(args: tuple[str, float, int]) -> dict[str, Tally]:
    """Every way of fitting on one draw: {row name: Tally}."""
    from runledger.training.reforecast import PlanChange, Registered, revise_forecast
    from runledger.training.schedule import make_schedule, retime

    law, noise, seed = args
    curves = rungs(law, np.random.default_rng(seed), noise)
    tgt = target(law)
    out = {name: Tally() for name in ("joint", "per_fraction", f"joint E-{WRONG_E}", "joint E=law", "shorten",
                                      "lengthen", "lengthen>H")}
    try:
        joint = fit_joint(curves)
    except ValueError:
        joint = None
        out["joint"].refused += 1
    for g in FRACTIONS:
        truth = float(tgt.loss(g * tgt.budget))
        if joint is not None:
            try:
                f = joint.forecast(tgt.flops, g)
                out["joint"].add(g, truth, f.projected_loss, f.band_low, f.band_high, bool(f.flags))
            except ValueError:
                out["joint"].refused += 1
        try:
            f = forecast(curves, tgt.flops, g)
            out["per_fraction"].add(g, truth, f.projected_loss, f.band_low, f.band_high, bool(f.flags))
        except ValueError:
            out["per_fraction"].refused += 1
    for name, E in ((f"joint E-{WRONG_E}", CH_E - WRONG_E), ("joint E=law", CH_E)):
        try:
            fixed = fit_joint(curves, E=E)
            for g in FRACTIONS:
                f = fixed.forecast(tgt.flops, g)
                out[name].add(g, float(tgt.loss(g * tgt.budget)), f.projected_loss, f.band_low, f.band_high,
                              any("reject" in fl for fl in f.flags))
        except ValueError:
            out[name].refused += 1
    tps = tgt.budget / TARGET_STEPS
    reg = Registered("t", [c.name for c in curves], tgt.fpt, int(round(tgt.budget)), "joint", None, None)
    sched = make_schedule(1e-3, max(round(0.05 * TARGET_STEPS), 1), TARGET_STEPS, 0.05, int(round(tps)))
    at = round(DECIDED_AT * TARGET_STEPS)
    for name, scale in (("shorten", SHORTEN), ("lengthen", LENGTHEN)):
        new = round(scale * TARGET_STEPS)
        change = PlanChange(f"d-{name}", "set_token_horizon", at, sched, retime(sched, at + 1, new))
        try:
            events, _ = revise_forecast(curves, reg, change, 1, (0.05, 0.05), joint=joint)
        except ValueError:
            out[name].refused += 1
            continue
        for e in events:
            truth = float(tgt.loss(e.fraction * change.horizon_tokens))
            past = e.fraction * change.horizon_tokens > reg.horizon_tokens * (1 + 1e-9)
            row = out["lengthen>H" if past else name]
            row.add(e.fraction, truth, e.projected_loss, e.band_low, e.band_high,
                    any(("extrapolat" in fl or "expected" in fl) for fl in e.flags))
    return out


def fmt(name: str, r: dict) -> str:
    lo, hi = r["ci"]
    return (f"{name:<16} {r['n']:>6} {r['coverage']:>8.1%} [{lo:>5.1%}, {hi:>5.1%}] {r['above']:>6} {r['below']:>6} "
            f"{r['bias']:>+8.4f} {r['width']:>8.4f} {r['flagged']:>8.0%} {r['fired']:>6.0%}")


HEAD = (f"{'row':<16} {'points':>6} {'coverage':>8} {'95% interval':>16} {'above':>6} {'below':>6} {'bias':>8} "
        f"{'width':>8} {'flagged':>8} {'fired':>6}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=100, help="draws per law and noise level")
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--laws", default="in_sample,data_term")
    ap.add_argument("--noise", default="0.005,0.01,0.02")
    ap.add_argument("--per-fraction", default=None, help="write the per-fraction tables to this markdown file")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    laws, noises = args.laws.split(","), [float(x) for x in args.noise.split(",")]
    log.info("%d rungs over %g decades from %.0e FLOPs, target %gx the last; seeds %d..%d per row; joint band "
             "%.0f%%, per-fraction band %.0f%%", RUNGS, DECADES, C0, TARGET_X, args.seed0,
             args.seed0 + args.seeds - 1, 100 * JOINT_BAND_LEVEL, 100 * BAND_LEVEL)
    t0 = time.perf_counter()
    jobs = [(law, noise, s) for law in laws for noise in noises for s in range(args.seed0, args.seed0 + args.seeds)]
    with multiprocessing.Pool(args.jobs) as pool:
        results = pool.map(draw, jobs, chunksize=4)
    tallies: dict[tuple[str, float], dict[str, Tally]] = {}
    for (law, noise, _), res in zip(jobs, results):
        acc = tallies.setdefault((law, noise), {})
        for name, t in res.items():
            acc.setdefault(name, Tally()).merge(t)
    md = []
    for (law, noise), acc in tallies.items():
        print(f"\n{law}, noise {noise:.1%}, {args.seeds} draws")
        print(HEAD)
        for name, t in acc.items():
            if not t.hit:
                continue
            r = t.row()
            worst = min(t.hit, key=lambda g: np.mean(t.hit[g]))
            print(fmt(name, r) + f"   worst fraction {worst:.0%}: {np.mean(t.hit[worst]):.1%}"
                  + (f", refused {t.refused}" if t.refused else ""))
            md.append(f"\n**{law}, noise {noise:.1%}, {name}** ({args.seeds} draws)\n\n```\n{HEAD}")
            md += [fmt(f"{g:.0%}", t.row([g])) for g in sorted(t.hit)]
            md.append("```")
    log.info("%d draws in %.1fs", len(jobs), time.perf_counter() - t0)
    if args.per_fraction:
        with open(args.per_fraction, "w") as fh:
            fh.write("# Per-fraction tables of `python -m bench.ladder_oos`\n" + "\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
