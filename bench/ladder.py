"""The ladder and its forecast through the real ledger: a local nats-server, `runledger ledger serve`
as a child process, the ladder for a target run (rungs trained, forecasts emitted), then the target
run itself, and `runledger audit forecast` on what the ledger stored.

    .venv/bin/python -m bench.ladder [--root DIR] [--preset small] [--rungs 4] [--steps-scale 1]
                                     [--target-steps N] [--E fit|0.6] [--stop-rung I@FRACTION]
                                     [--fit joint|per-fraction] [--shorten STEP:HORIZON]

`--E fit` (the default) fits E with the law and sizes the band by its profile; a number fixes E.
`--fit` is the fit the ladder emits (joint by default); both are compared either way.
`--shorten STEP:HORIZON` is the contingency: a decision moves the target's horizon to HORIZON steps
before update STEP (applied by the worker's own decision code), and the ladder re-forecasts the new plan.

Logs the ladder's wall time (the demo ladder's budget: 3 minutes on 2 cores), the target's, prints the
two fits side by side against the target's observed loss (the audit's observation: the mean loss of
the last block at or before each point): points reached, coverage of the band, mean residual, mean
|residual|, median band width and the count of non-monotone projections; then the audit table
(the plans, then observed vs projected loss at each 5% of each plan).
"""

from __future__ import annotations

import argparse
import logging
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runledger.ledger.emit.emitter import Emitter
from runledger.ledger.bus.natsserver import NatsServer

REPO = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.ladder")


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def wait_for(root: Path, sql: str, expected: int, timeout: float = 300) -> int:
    import duckdb

    from runledger import queries

    deadline, n = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        try:
            n = queries.connect(root).execute(sql).fetchone()[0]
        except duckdb.IOException:
            continue
        if n >= expected:
            break
        time.sleep(0.5)
    return n


def shorten(run_id: str, at_step: int, horizon: int, nats_url: str, root: Path):
    """A decision source for the worker: a `set_token_horizon` decision (recorded like a person's) handed
    out before update `at_step`."""
    from runledger.ledger.contract.events import DecisionMade

    d = DecisionMade(decision_id=f"bench:{run_id}:shorten:{horizon}", agent="bench", rule="contingency",
                     action="set_token_horizon", params={"horizon_steps": horizon},
                     rationale=f"the bench's contingency: the horizon moved to {horizon} steps", evidence={})
    given = []

    def source(step: int) -> list[dict]:
        if given or step + 1 < at_step:
            return []
        em = Emitter(run_id, "cli", 0, nats_url, root / "spool")
        em.emit(d, step=step)
        em.close()
        given.append(d.decision_id)
        return [d.model_dump()]

    return source


def observed_at(root: Path, run_id: str, at_tokens: list[float]) -> list[float | None]:
    """The audit's observation at each point: the mean loss of the last block ending at or before it
    (views.sql step_progress), None where the run has not reached it."""
    from runledger import queries

    rows = queries.connect(root).execute("select tokens_seen, loss_mean from step_progress where run_id = ? "
                                         "order by tokens_seen", [run_id]).fetchall()
    reached = rows[-1][0] if rows else 0
    out = []
    for t in at_tokens:
        before = [y for seen, y in rows if seen <= t]
        out.append(before[-1] if before and reached >= t else None)
    return out


def compare_fits(root: Path, run_id: str, result) -> None:
    """The joint fit and one law per fraction on the same rungs, against the target as registered."""
    import numpy as np

    from runledger.training.ladder import fit_ladder
    from runledger.training.ladder_joint import non_monotone

    lines = [f"{'fit':<13} {'points':>6} {'inside':>6} {'coverage':>8} {'mean resid':>10} {'mean |resid|':>12} "
             f"{'median band':>11} {'non-monotone':>12}"]
    for method in ("joint", "per_fraction"):
        fc, _, _ = fit_ladder(result.curves, result.target_flops, result.E, method=method)
        obs = observed_at(root, run_id, [f.fraction * result.target_tokens for f in fc])
        pairs = [(f, y) for f, y in zip(fc, obs) if y is not None]
        resid = np.array([y - f.projected_loss for f, y in pairs])
        inside = sum(f.band_low <= y <= f.band_high for f, y in pairs)
        width = float(np.median([f.band_high - f.band_low for f in fc])) if fc else float("nan")
        lines.append(f"{method:<13} {len(pairs):>6} {inside:>6} {inside / max(len(pairs), 1):>8.0%} "
                     f"{resid.mean() if len(resid) else float('nan'):>10.4f} "
                     f"{np.abs(resid).mean() if len(resid) else float('nan'):>12.4f} {width:>11.4f} "
                     f"{non_monotone([f.projected_loss for f in fc]):>12d}")
        for f, y in zip(fc, obs):
            log.info("%s %4.0f%%: projected %.4f [%.4f, %.4f] observed %s", method, 100 * f.fraction, f.projected_loss,
                     f.band_low, f.band_high, "n/a" if y is None else f"{y:.4f}")
    sys.stdout.write("\n".join(lines) + "\n\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=None)
    ap.add_argument("--preset", default="small", help="the target's preset")
    ap.add_argument("--target", default="main")
    ap.add_argument("--rungs", type=int, default=4)
    ap.add_argument("--steps-scale", type=float, default=1.0)
    ap.add_argument("--target-steps", type=int, default=None, help="stop the target early (default: its horizon)")
    ap.add_argument("--E", default="fit", help="'fit' (default) or a fixed irreducible loss, nats/byte")
    ap.add_argument("--stop-rung", default=None, metavar="I@FRACTION",
                    help="a drill: rung I dies at this fraction of its steps (kept, extrapolated, flagged)")
    ap.add_argument("--fit", choices=["joint", "per-fraction"], default="joint", help="the fit the ladder emits")
    ap.add_argument("--shorten", default=None, metavar="STEP:HORIZON",
                    help="the contingency: the target's horizon moved to HORIZON steps before update STEP")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "jax._src.xla_bridge", "nats"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from runledger.training.resume import ckpt_dir
    from runledger.training.config import preset
    from runledger.training.flops import measure_peak_flops
    from runledger.training.ladder import run_ladder
    from runledger.training.worker import train

    root = Path(args.root or tempfile.mkdtemp(prefix="runledger-ladder-"))
    root.mkdir(parents=True, exist_ok=True)
    server = NatsServer(root / "nats").start()
    ledger = subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "ledger", "serve", "--root", str(root),
                               "--nats", server.url], cwd=REPO, stdout=open(root / "ledger.log", "ab"),
                              stderr=subprocess.STDOUT)
    try:
        peak = measure_peak_flops()
        stop_after = None
        if args.stop_rung:
            from runledger.training.ladder import rung_configs, tokens_per_param

            i, frac = args.stop_rung.split("@")
            target = preset(args.preset)
            steps = rung_configs(int(i) + 1, tokens_per_param(target), args.steps_scale, recipe=target)[int(i)][1].steps
            stop_after = {int(i): max(1, round(float(frac) * steps))}
        t0, cpu0 = time.perf_counter(), _cpu_s()
        result = run_ladder(args.target, root=root, nats_url=server.url, target_preset=args.preset,
                            n_rungs=args.rungs, steps_scale=args.steps_scale, peak_flops=peak,
                            E=None if args.E == "fit" else float(args.E), stop_after=stop_after,
                            method=args.fit.replace("-", "_"))
        ladder_s, ladder_cpu = time.perf_counter() - t0, _cpu_s() - cpu0
        log.info("ladder: %d rungs in %.0fs wall, %.0fs CPU; self-check error %s", len(result.curves), ladder_s,
                 ladder_cpu, result.self_check_error)

        t0 = time.perf_counter()
        em = Emitter(args.target, "worker-0", 0, server.url, root / "spool")
        decisions = None
        if args.shorten:
            decisions = shorten(args.target, *map(int, args.shorten.split(":")), server.url, root)
        try:
            train(preset(args.preset), run_id=args.target, ckpt_dir=ckpt_dir(root, args.target), sink=em,
                  preset=args.preset, peak_flops=peak, steps=args.target_steps, decisions=decisions)
        finally:
            em.close()
        log.info("target %s: trained in %.0fs wall", args.target, time.perf_counter() - t0)

        n = wait_for(root, f"select count(*) from runs_finished where run_id = '{args.target}'", 1)
        m = wait_for(root, f"select count(*) from forecasts where run_id = '{args.target}'", len(result.forecasts))
        log.info("ledger: target finished (%d), %d forecasts stored under %s", n, m, root)
        if args.shorten:
            from runledger.training.reforecast import emit_revisions

            revised = emit_revisions(root, args.target, server.url)
            m = wait_for(root, f"select count(*) from forecasts where run_id = '{args.target}'", m + revised)
            log.info("ledger: %d revised forecast points, %d forecasts stored", revised, m)
        compare_fits(root, args.target, result)
    finally:
        ledger.terminate()
        ledger.wait(60)
        server.stop()
    audit = subprocess.run([sys.executable, "-m", "runledger.tools.cli", "audit", "forecast", args.target, "--root", str(root)],
                           cwd=REPO, capture_output=True, text=True)
    sys.stdout.write(audit.stdout)
    sys.stderr.write(audit.stderr[-2000:])
    from runledger.queries.audit import run_suite

    hit = next(r for r in run_suite(root, "health", args.target).rows() if r["check"] == "forecast_hit")
    sys.stdout.write(f"forecast_hit: {hit['status']} (worst residual {hit['value']}, at step {hit['at_step']}): "
                     f"{hit['evidence']}\n")
    log.info("ladder: %.0fs wall, %.0fs CPU in this process (budget: 180s on 2 cores)", ladder_s, ladder_cpu)
    return audit.returncode


if __name__ == "__main__":
    sys.exit(main())
