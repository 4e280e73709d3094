"""The ladder and its forecast through the real ledger: a local nats-server, `runledger ledger serve`
as a child process, the ladder for a target run (rungs trained, forecasts emitted), then the target
run itself, and `runledger audit forecast` on what the ledger stored.

    .venv/bin/python -m bench.ladder [--root DIR] [--preset small] [--rungs 4] [--steps-scale 1]
                                     [--target-steps N] [--E fit|0.6] [--stop-rung I@FRACTION]

`--E fit` (the default) fits E with the law and sizes the band by its profile; a number fixes E.

Logs the ladder's wall time (the demo ladder's budget: 3 minutes on 2 cores), the target's, and
prints the audit table (observed vs projected loss at each 5%, residuals, inside the band or not).
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

from ledger.emitter import Emitter
from ledger.natsserver import NatsServer

REPO = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.ladder")


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def wait_for(root: Path, sql: str, expected: int, timeout: float = 300) -> int:
    import duckdb

    import queries

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
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "jax._src.xla_bridge", "nats"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from training.resume import ckpt_dir
    from training.config import preset
    from training.flops import measure_peak_flops
    from training.ladder import run_ladder
    from training.worker import train

    root = Path(args.root or tempfile.mkdtemp(prefix="runledger-ladder-"))
    root.mkdir(parents=True, exist_ok=True)
    server = NatsServer(root / "nats").start()
    ledger = subprocess.Popen([sys.executable, "-m", "tools.cli", "ledger", "serve", "--root", str(root),
                               "--nats", server.url], cwd=REPO, stdout=open(root / "ledger.log", "ab"),
                              stderr=subprocess.STDOUT)
    try:
        peak = measure_peak_flops()
        stop_after = None
        if args.stop_rung:
            from training.ladder import rung_configs, tokens_per_param

            i, frac = args.stop_rung.split("@")
            target = preset(args.preset)
            steps = rung_configs(int(i) + 1, tokens_per_param(target), args.steps_scale, recipe=target)[int(i)][1].steps
            stop_after = {int(i): max(1, round(float(frac) * steps))}
        t0, cpu0 = time.perf_counter(), _cpu_s()
        result = run_ladder(args.target, root=root, nats_url=server.url, target_preset=args.preset,
                            n_rungs=args.rungs, steps_scale=args.steps_scale, peak_flops=peak,
                            E=None if args.E == "fit" else float(args.E), stop_after=stop_after)
        ladder_s, ladder_cpu = time.perf_counter() - t0, _cpu_s() - cpu0
        log.info("ladder: %d rungs in %.0fs wall, %.0fs CPU; self-check error %s", len(result.curves), ladder_s,
                 ladder_cpu, result.self_check_error)

        t0 = time.perf_counter()
        em = Emitter(args.target, "worker-0", 0, server.url, root / "spool")
        try:
            train(preset(args.preset), run_id=args.target, ckpt_dir=ckpt_dir(root, args.target), sink=em,
                  preset=args.preset, peak_flops=peak, steps=args.target_steps)
        finally:
            em.close()
        log.info("target %s: trained in %.0fs wall", args.target, time.perf_counter() - t0)

        n = wait_for(root, f"select count(*) from runs_finished where run_id = '{args.target}'", 1)
        m = wait_for(root, f"select count(*) from forecasts where run_id = '{args.target}'", len(result.forecasts))
        log.info("ledger: target finished (%d), %d forecasts stored under %s", n, m, root)
    finally:
        ledger.terminate()
        ledger.wait(60)
        server.stop()
    audit = subprocess.run([sys.executable, "-m", "tools.cli", "audit", "forecast", args.target, "--root", str(root)],
                           cwd=REPO, capture_output=True, text=True)
    sys.stdout.write(audit.stdout)
    sys.stderr.write(audit.stderr[-2000:])
    log.info("ladder: %.0fs wall, %.0fs CPU in this process (budget: 180s on 2 cores)", ladder_s, ladder_cpu)
    return audit.returncode


if __name__ == "__main__":
    sys.exit(main())
