"""The cost a user feels in a training loop: one `log` call between real steps, against Trackio's, beside the
floor (one buffered write of the same bytes); a whole first process; and a SIGKILL after the last `log`
(issue 39, items 1 and 2).

    python -m bench.log_cost [--rounds 3] [--steps 1000] [--names 20] [--step-ms 20] [--work sleep|matmul]
    python -m bench.log_cost --first [--rounds 3]        # import + init + one log + finish, cold and warm root
    python -m bench.log_cost --kill                      # SIGKILL 0.5 s after the last log: what is kept
    python -m bench.log_cost --heads [--rounds 3]        # signed chain heads on against off: log, and a first process
    python -m bench.log_cost ... --code DIR              # another checkout's runledger (see bench.at_rest)

per call  each tool in a fresh process, one after the other, the order rotating per round: N steps, each
          `step_ms` of device time (a sleep, or a numpy matmul of about that length), then one call
          logging `names` floats, timed with perf_counter_ns around the call alone. runledger's process
          also times, beside each `log`, the floor: one buffered write (a file opened with Python's
          default buffer) of the bytes the intake takes for that call (`[seq, kind, step, time,
          payload]` as orjson writes it). Per tool: the median and the mean per call over every call of
          every round; the ratios are runledger/Trackio per round, the median of the rounds'.
--first   a fresh process: `import X`, init, one log of 20 names, finish; wall (and the child's CPU) per
          tool: runledger on a cold root (no server running: init starts one) and on a warm one (its
          supervisor up), Trackio (a fresh and a used directory), W&B offline.
--heads   runledger alone, with signed chain heads on ($RUNLEDGER_HEADS=on: a head every 1,000 events, 30 s,
          and at finish) and off, the order alternating per round: `log` per call as above, then a first
          process (import + init on a cold root + one log + finish); the ratios are on/off.
--kill    a fresh process logs N steps, prints after the last `log`, and is SIGKILLed 0.5 s later; then
          what each store holds of it is counted (runledger: `runledger sql` on the root; Trackio: its
          SQLite file).

Load average printed before and after: the machine's other work moves absolute figures, the paired ratios
much less. Not a test: no timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from bench.at_rest import code_env

RUNLEDGER = textwrap.dedent("""
    import json, os, sys, time
    import orjson
    import runledger
    from runledger.ledger.emit.sealing import utc_now
    steps, names, step_ms, work = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    {setup}
    keys = [f"train/m{{i}}" for i in range(names)]
    run = runledger.init(project="cost", system_metrics=False)
    calls, floor = [], []
    f = open("floor.jsonl", "wb")
    for step in range(steps):
        {work}
        values = {{k: step * 1e-3 + j for j, k in enumerate(keys)}}
        t = time.perf_counter_ns()
        runledger.log(values, step=step)
        calls.append(time.perf_counter_ns() - t)
        t = time.perf_counter_ns()
        f.write(orjson.dumps([step, "metrics", step, utc_now(), {{"metrics": values}}]) + b"\\n")
        floor.append(time.perf_counter_ns() - t)
    run.finish()
    print(json.dumps({{"calls": calls, "floor": floor}}))
""")

TRACKIO = textwrap.dedent("""
    import json, sys, time
    import trackio
    steps, names, step_ms, work = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    {setup}
    keys = [f"train/m{{i}}" for i in range(names)]
    trackio.init(project="cost")
    calls = []
    for step in range(steps):
        {work}
        values = {{k: step * 1e-3 + j for j, k in enumerate(keys)}}
        t = time.perf_counter_ns()
        trackio.log(values, step=step)
        calls.append(time.perf_counter_ns() - t)
    trackio.finish()
    print(json.dumps({{"calls": calls}}))
""")

SETUP = {"sleep": "", "matmul": textwrap.dedent("""
    import numpy as np
    a = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    reps = 1
    t = time.perf_counter()
    while time.perf_counter() - t < step_ms / 1e3 and reps < 10**6:  # matmuls in one step_ms (calibrated once)
        a @ a
        reps += 1
""")}
WORK = {"sleep": "time.sleep(step_ms / 1e3) if step_ms else None", "matmul": "[a @ a for _ in range(reps)]"}

FIRST = {
    "runledger": "import runledger; run = runledger.init(project='first', system_metrics=False); "
                 "runledger.log({f'train/m{i}': 1.0 for i in range(20)}); run.finish()",
    "trackio": "import trackio; trackio.init(project='first'); trackio.log({f'train/m{i}': 1.0 for i in range(20)}); "
               "trackio.finish()",
    "wandb": "import wandb; run = wandb.init(project='first', mode='offline'); "
             "run.log({f'train/m{i}': 1.0 for i in range(20)}); run.finish()",
}


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def child(code: str, args: list[str], env: dict, cwd: Path, timeout: float = 900) -> tuple[float, float, str]:
    """(wall s, the child's CPU s, its stdout) of one fresh process."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-c", code, *args], env=env, cwd=cwd, stdout=out, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - start
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            raise RuntimeError(f"{code[:80]}... failed: {err.read().decode()[-2000:]}")
        return wall, usage.ru_utime + usage.ru_stime, out.read().decode()


def envs(base: Path, code: str | None) -> dict:
    env = code_env(Path(code) if code else None, base)
    env.update(RUNLEDGER_ROOT=str(base / "root"), HF_HOME=str(base / "hf"), TRACKIO_DIR=str(base / "trackio"),
               WANDB_DIR=str(base / "wandb"), WANDB_SILENT="true", RUNLEDGER_SILENT="1", PYTHONWARNINGS="ignore")
    for var in ("RUNLEDGER_NATS", "RUNLEDGER_CREDS"):
        env.pop(var, None)
    return env


def down(base: Path, env: dict) -> None:
    """Stop the root's supervisor (before its folder goes)."""
    subprocess.run([sys.executable, "-m", "runledger.tools.cli", "down", "--root", str(base / "root")], env=env,
                   capture_output=True, timeout=120)


def per_call(args) -> None:
    print(f"log per call: {args.names} names, {args.steps} steps, {args.step_ms:g} ms of {args.work} a step, "
          f"{args.rounds} rounds; load {load()}")
    scripts = {"runledger": RUNLEDGER, "trackio": TRACKIO}
    got: dict[str, list] = {"runledger": [], "trackio": [], "floor": []}
    ratios_med, ratios_mean, floor_ratio = [], [], []
    for r in range(args.rounds):
        order = list(scripts) if r % 2 == 0 else list(reversed(scripts))
        this: dict[str, list] = {}
        for tool in order:
            with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as d:
                code = scripts[tool].format(setup=SETUP[args.work], work=WORK[args.work])
                _, _, out = child(code, [str(args.steps), str(args.names), str(args.step_ms), args.work],
                                  envs(Path(d), args.code), Path(d))
                down(Path(d), envs(Path(d), args.code))
            data = json.loads(out.strip().splitlines()[-1])
            this[tool] = [c / 1e3 for c in data["calls"]]
            if "floor" in data:
                this["floor"] = [c / 1e3 for c in data["floor"]]
        for k, v in this.items():
            got[k] += v
        ratios_med.append(statistics.median(this["runledger"]) / statistics.median(this["trackio"]))
        ratios_mean.append(statistics.fmean(this["runledger"]) / statistics.fmean(this["trackio"]))
        floor_ratio.append(statistics.median(this["runledger"]) / statistics.median(this["floor"]))
        print(f"  round {r + 1}: runledger median {statistics.median(this['runledger']):.1f} us, mean "
              f"{statistics.fmean(this['runledger']):.1f}; trackio median {statistics.median(this['trackio']):.1f}, mean "
              f"{statistics.fmean(this['trackio']):.1f}; floor median {statistics.median(this['floor']):.1f}")
    for k, v in got.items():
        print(f"{k:10s} per call: median {statistics.median(v):8.1f} us  mean {statistics.fmean(v):8.1f} us  "
              f"p99 {sorted(v)[int(len(v) * 0.99)]:8.1f} us")
    print(f"runledger/trackio: median {statistics.median(ratios_med):.2f}x (rounds {', '.join(f'{x:.2f}' for x in ratios_med)}), "
          f"mean {statistics.median(ratios_mean):.2f}x (rounds {', '.join(f'{x:.2f}' for x in ratios_mean)})")
    print(f"runledger/floor (median per call): {statistics.median(floor_ratio):.1f}x; load {load()}")


def first(args) -> None:
    print(f"a fresh process: import, init, one log of 20 names, finish; {args.rounds} rounds; load {load()}")
    walls: dict[str, list] = {}
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as warm_dir:
        warm = Path(warm_dir)
        child(FIRST["runledger"], [], envs(warm, args.code), warm)  # the warm root's server up (and trackio's dir made)
        child(FIRST["trackio"], [], envs(warm, args.code), warm)
        for r in range(args.rounds):
            cases = [("runledger cold", FIRST["runledger"], None), ("runledger warm", FIRST["runledger"], warm),
                     ("trackio cold", FIRST["trackio"], None), ("trackio warm", FIRST["trackio"], warm),
                     ("wandb offline", FIRST["wandb"], None)]
            cases = cases[r % len(cases):] + cases[:r % len(cases)]
            for name, code, where in cases:
                with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as d:
                    base = where or Path(d)
                    wall, cpu, _ = child(code, [], envs(base, args.code), base)
                    walls.setdefault(name, []).append((wall, cpu))
                    if where is None and name.startswith("runledger"):  # its supervisor: stopped with its root
                        down(base, envs(base, args.code))
        down(warm, envs(warm, args.code))
    med = {k: statistics.median(w for w, _ in v) for k, v in walls.items()}
    for k, v in walls.items():
        print(f"{k:15s} wall median {med[k]:.2f} s (rounds {', '.join(f'{w:.2f}' for w, _ in v)}), "
              f"CPU median {statistics.median(c for _, c in v):.2f} s")
    print(f"runledger cold / trackio cold {med['runledger cold'] / med['trackio cold']:.2f}x, "
          f"runledger cold / wandb offline {med['runledger cold'] / med['wandb offline']:.2f}x, "
          f"runledger warm / trackio warm {med['runledger warm'] / med['trackio warm']:.2f}x; load {load()}")


def heads(args) -> None:
    print(f"signed chain heads on against off: {args.names} names, {args.steps} steps, {args.step_ms:g} ms of "
          f"{args.work} a step, then a first process on a cold root; {args.rounds} rounds; load {load()}")
    calls: dict[str, list] = {"on": [], "off": []}
    walls: dict[str, list] = {"on": [], "off": []}
    code = RUNLEDGER.format(setup=SETUP[args.work], work=WORK[args.work])
    for r in range(args.rounds):
        for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
            with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as d:
                env = {**envs(Path(d), args.code), "RUNLEDGER_HEADS": mode}
                _, _, out = child(code, [str(args.steps), str(args.names), str(args.step_ms), args.work], env, Path(d))
                down(Path(d), env)
            calls[mode] += [c / 1e3 for c in json.loads(out.strip().splitlines()[-1])["calls"]]
            with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as d:
                env = {**envs(Path(d), args.code), "RUNLEDGER_HEADS": mode}
                walls[mode].append(child(FIRST["runledger"], [], env, Path(d))[:2])
                down(Path(d), env)
    for mode in ("on", "off"):
        v = calls[mode]
        print(f"heads {mode:3s} log per call: median {statistics.median(v):7.1f} us  mean {statistics.fmean(v):7.1f} us  "
              f"p99 {sorted(v)[int(len(v) * 0.99)]:7.1f} us; first process wall median "
              f"{statistics.median(w for w, _ in walls[mode]):.2f} s (rounds {', '.join(f'{w:.2f}' for w, _ in walls[mode])}), "
              f"CPU median {statistics.median(c for _, c in walls[mode]):.2f} s")
    print(f"on/off: log median {statistics.median(calls['on']) / statistics.median(calls['off']):.2f}x, mean "
          f"{statistics.fmean(calls['on']) / statistics.fmean(calls['off']):.2f}x; first process wall "
          f"{statistics.median(w for w, _ in walls['on']) / statistics.median(w for w, _ in walls['off']):.2f}x; load {load()}")


KILLED = textwrap.dedent("""
    import sys, time
    steps, tool = int(sys.argv[1]), sys.argv[2]
    if tool == "runledger":
        import runledger as t
        t.init(project="kill", id="killed", system_metrics=False)
    else:
        import trackio as t
        t.init(project="kill")
    for step in range(steps):
        t.log({"loss": 1.0 / (step + 1), "step_seen": float(step)}, step=step)
    print("logged", flush=True)
    time.sleep(600)
""")


def kill(args) -> None:
    print(f"SIGKILL 0.5 s after the last of {args.steps} logs; load {load()}")
    for tool in ("runledger", "trackio"):
        with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as d:
            base = Path(d)
            env = envs(base, args.code)
            p = subprocess.Popen([sys.executable, "-c", KILLED, str(args.steps), tool], env=env, cwd=base,
                                 stdout=subprocess.PIPE, text=True)
            while (line := p.stdout.readline()) and line.strip() != "logged":  # (Trackio prints lines of its own)
                pass
            assert line, f"{tool}'s child ended before its last log"
            time.sleep(0.5)
            p.send_signal(signal.SIGKILL)
            p.wait()
            if tool == "runledger":  # the root's supervisor sends what the killed run left; sql waits for it
                out = subprocess.run([sys.executable, "-m", "runledger.tools.cli", "sql", "--root", str(base / "root"),
                                      "--format", "csv", "select count(*) from metrics where key = 'step_seen'"],
                                     env={**env, "RUNLEDGER_STORE_WAIT_S": "60"}, capture_output=True, text=True, timeout=300)
                kept = int(out.stdout.strip().splitlines()[-1])
                if out.stderr.strip():
                    print(f"  runledger sql said: {out.stderr.strip()[-300:]}")
                down(base, env)
            else:
                kept = 0
                for db in base.rglob("*.db"):
                    try:
                        con = sqlite3.connect(db)
                        kept += con.execute("select count(*) from metrics").fetchone()[0]
                    except sqlite3.Error:
                        continue
            print(f"{tool:10s} kept {kept} of {args.steps} steps")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--names", type=int, default=20)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--work", choices=sorted(WORK), default="sleep")
    p.add_argument("--first", action="store_true")
    p.add_argument("--kill", action="store_true")
    p.add_argument("--heads", action="store_true")
    p.add_argument("--code", default=None)
    args = p.parse_args()
    first(args) if args.first else kill(args) if args.kill else heads(args) if args.heads else per_call(args)


if __name__ == "__main__":
    main()
