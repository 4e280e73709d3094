"""`runledger demo [--root DIR] [--quick] [--ui]`: everything runledger is for, end to end on one machine.

Local NATS → ledger service → agents → (full only) the scaling ladder with its forecast → the main
run, in which
  (a) a slow-down planted in its first quarter makes the throughput agent shorten the horizon,
  (b) a scheduled context extension is probed ahead and held by the drop agent,
  (c) the worker is SIGKILLed once and resumes from its last checkpoint;
then the audit (health, provenance, forecast vs actual, decision trail), `verify`, and report.html;
last, the command that opens the ledger in the dashboard (`--ui`: the dashboard is up while it runs).
Every component is a real process (`runledger ledger serve`, `runledger agents`, `runledger train`),
stopped cleanly at the end; a second demo runs in a fresh root.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from runledger import queries
from runledger.ledger import settings
from runledger.ledger.bus.natsserver import NatsServer
from runledger.ledger.check.verify import verify

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent
RUN = "main"


@dataclass(frozen=True)
class Plan:
    """The demo's main run: preset, horizon, the planted faults, and the run's declared limits."""

    preset: str
    horizon: int
    slow_until: int  # (a) a slow node for the first steps ...
    slow_s: float  # ... each update this much longer
    planned_step_s: float  # the plan: seconds per step
    extend_at: int  # (b) the scheduled context extension ...
    extend_len: int  # ... to this sequence length (8x: the drops it would meet are higher)
    kill_after: int  # (c) SIGKILL the worker once the ledger has this step, or sooner: see Demo.should_kill
    ckpt_every: int
    ladder_scale: float | None  # None: no ladder (quick)
    # The toy model drops ~26% of assignments at its trained length (the pooled-wave accounting at
    # this tiny scale, untrained router) and ~40% at 8x the length; the demo declares its limit in
    # between, in run_started.thresholds, where the audit and the agents read it; its runs are short,
    # so the audit's blocks and the agents' trailing window are 3 steps.
    thresholds: dict = field(default_factory=lambda: {"drop_fraction_max": 0.33, "drop_fraction_agent_max": 0.33, "block_steps": 3,
                                                      "agent_window_steps": 3})


# (quick: the slow node stays slow up to the extension, so that the 12 steps the worker probes ahead
# of it take seconds, not the ~1 s the tiny model's steps would: room for the drop agent's verdict)
KILL_MARGIN = 3  # (c) at the latest this many steps before the horizon in force
QUICK = Plan("tiny", 40, 24, 0.6, 0.5, 24, 512, 7, 5, None)
FULL = Plan("small", 160, 40, 0.6, 0.6, 12, 1024, 60, 20, 0.5)


class Demo:
    def __init__(self, root: Path, plan: Plan, console: Console):
        self.root, self.plan, self.console = root, plan, console
        self.procs: list[subprocess.Popen] = []
        self.nats: NatsServer | None = None

    def spawn(self, name: str, *args: str) -> subprocess.Popen:
        logf = open(self.root / "logs" / f"{name}.log", "ab")
        p = subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", *args], cwd=REPO, stdout=logf,
                             stderr=subprocess.STDOUT, env=settings.child_env(PYTHONUNBUFFERED="1"))
        self.procs.append(p)
        return p

    def sql(self, query: str, default=None):
        try:
            row = queries.connect(self.root).execute(query).fetchone()
        except duckdb.Error:  # a file compacted away between listing and reading
            return default
        return row[0] if row and row[0] is not None else default

    def start(self) -> None:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        self.nats = NatsServer(self.root / "nats").start()
        self.spawn("ledger", "ledger", "serve", "--root", str(self.root), "--nats", self.nats.url)
        # the agents watch the main run; the ladder's rungs keep the recipe they were given
        self.spawn("agents", "agents", "--root", str(self.root), "--nats", self.nats.url, "--run-id", RUN)

    def train_args(self, resume: bool) -> list[str]:
        p = self.plan
        from runledger.training.config import preset

        tokens_per_step = preset(p.preset).tokens_per_step
        args = ["train", "--preset", p.preset, "--run-id", RUN, "--root", str(self.root), "--nats", self.nats.url,
                "--slow", f"{p.slow_until}:{p.slow_s}",
                "--planned-tokens-per-s", str(tokens_per_step / p.planned_step_s),
                "--extend-context", f"{p.extend_at}:{p.extend_len}", "--set", f"ckpt_every={p.ckpt_every}"]
        args += [a for k, v in p.thresholds.items() for a in ("--threshold", f"{k}={v}")]
        # a resumed attempt goes on with the schedule in force (decisions included), from the ledger
        return args + (["--resume"] if resume else ["--horizon-steps", str(p.horizon)])

    def ladder(self, progress: Progress) -> None:
        task = progress.add_task("ladder: 4 rungs + forecast", total=None)
        p = self.spawn("ladder", "ladder", "--preset", self.plan.preset, "--rungs", "4", "--target", RUN,
                       "--root", str(self.root), "--nats", self.nats.url, "--steps-scale", str(self.plan.ladder_scale),
                       "--horizon-steps", str(self.plan.horizon))  # the main run's plan, not the preset's
        rc = p.wait()
        progress.update(task, total=1, completed=1,
                        description=f"ladder: {self.sql(f'select count(*) from forecasts where target_run = {RUN!r}', 0)} forecast points")
        if rc != 0:
            log.warning("the ladder exited %d (see %s)", rc, self.root / "logs" / "ladder.log")

    def should_kill(self, step: int, horizon: int) -> bool:
        """(c) is triggered by events, never by a step fixed before the horizon is known (issue 45: a loaded
        machine's throughput agent cut the horizon to 37, below a planned kill at 60, and the resumed attempt
        never happened): once a checkpoint is in the ledger and the worker is past it, the worker is killed
        when (a)'s horizon decision has been applied, at `kill_after`, or when the horizon in force is
        KILL_MARGIN steps away, whichever comes first, so that the resumed attempt always has steps to train."""
        if step >= horizon:
            return False
        ckpt = self.sql(f"select max(step) from checkpoints where run_id = {RUN!r}", 0)
        if not ckpt or step <= ckpt:
            return False
        shortened = self.sql(f"""select count(*) from decisions_applied where run_id = {RUN!r}
                                 and action = 'set_token_horizon' and status = 'applied'""", 0)
        return bool(shortened) or step >= self.plan.kill_after or horizon - step <= KILL_MARGIN

    def main_run(self, progress: Progress) -> None:
        p = self.plan
        task = progress.add_task("main run", total=p.horizon)
        worker = self.spawn("train-0", *self.train_args(resume=False))
        killed = False
        while True:
            step = self.sql(f"select max(step) from steps where run_id = {RUN!r}", 0)
            horizon = self.sql(f"""select json_extract(after, '$.horizon_steps')::int from decisions_applied
                                  where run_id = {RUN!r} and action = 'set_token_horizon' and status = 'applied'
                                  order by stream_seq desc limit 1""", p.horizon)
            held = self.sql(f"""select count(*) filter (where action = 'hold_context_extension')
                                       - count(*) filter (where action = 'release_context_extension')
                                from decisions_applied where run_id = {RUN!r} and status = 'applied'""", 0) > 0
            progress.update(task, total=horizon, completed=step,
                            description=f"main run: step {step}/{horizon}" + (" · extension held" if held else "")
                            + (" · resumed" if killed else ""))
            if not killed and self.should_kill(step, horizon):
                worker.send_signal(signal.SIGKILL)  # (c) the worker dies mid-run ...
                worker.wait()
                killed = True
                progress.console.log(f"worker SIGKILLed after step {step}; resuming from its last checkpoint")
                worker = self.spawn("train-1", *self.train_args(resume=True))  # ... and resumes
            if worker.poll() is not None:
                if worker.returncode != 0:
                    raise RuntimeError(f"the worker exited {worker.returncode}: see {self.root / 'logs'}")
                break
            time.sleep(0.5)
        deadline = time.monotonic() + 60
        while not self.sql(f"select count(*) from runs_finished where run_id = {RUN!r} and status = 'completed'", 0):
            if time.monotonic() > deadline:
                raise RuntimeError("the run's last events did not reach the ledger within 60 s")
            time.sleep(0.3)
        progress.update(task, completed=progress.tasks[task].total)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        if self.nats:
            self.nats.stop()


def what_happened(root: Path) -> dict:
    """(a), (b), (c) as the ledger tells them (the quick demo's test asks the same)."""
    con = queries.connect(root)
    one = lambda q: con.execute(q).fetchone()[0]  # noqa: E731
    return {
        "a_horizon_shortened": one(f"""select count(*) from decisions d join decisions_applied a using (decision_id)
            where d.run_id = {RUN!r} and d.action = 'set_token_horizon' and a.status = 'applied'"""),
        "b_extension_held": one(f"""select count(*) from decisions d join decisions_applied a using (decision_id)
            where d.run_id = {RUN!r} and d.action = 'hold_context_extension' and a.status = 'applied'"""),
        "c_resumed_attempts": one(f"select count(*) from runs where run_id = {RUN!r} and resumed_from is not null"),
    }


SHOWN = {  # the columns the terminal shows; report.html and `runledger audit` have them all
    "provenance/decision_trail": ("decided_at_step", "agent", "action", "mode", "status", "applied_at_step",
                                  "applied_in_attempt", "rationale"),
    "provenance/data_mixture": ("domain", "declared_share", "token_share", "share_minus_declared", "tokens"),
    "provenance/checkpoint_lineage": ("attempt", "start_kind", "from_step", "from_hash", "lineage"),
    "provenance/code_commits": None,
    "forecast/vs_actual": ("fraction", "at_step", "projected_loss", "band_low", "band_high", "band_level", "observed_loss",
                           "residual", "inside_band"),
}


def say_what_happened(happened: dict, console: Console) -> None:
    """(a), (b) and (c) in words: each shown, or not and why (the ledger's counts)."""
    words = {
        "a_horizon_shortened": ("(a) the throughput agent shortened the horizon, the decay retimed to it",
                                "no set_token_horizon decision was applied (the agent saw no slow-down it acts on "
                                "within the first quarter)"),
        "b_extension_held": ("(b) the drop agent held the scheduled context extension",
                             "no hold_context_extension was applied (the probe ahead of it met no drops over the limit)"),
        "c_resumed_attempts": ("(c) the worker was SIGKILLed and resumed from its last checkpoint",
                               "no attempt resumed from a checkpoint (the run ended before one was written)"),
    }
    for key, (shown, why) in words.items():
        n = happened.get(key, 0)
        console.print(f"{shown}: shown ({n})" if n else f"{shown.split(' ', 1)[0]} NOT shown: {why}")


def print_audit(root: Path, console: Console) -> None:
    from runledger.queries.audit import cell, run_suite

    health = run_suite(root, "health", RUN)
    t = Table("check", "status", "value", "threshold", "at step", title="Health checklist (queries/health/*.sql)")
    style = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
    for r in health.rows():
        t.add_row(r["check"], f"[{style.get(r['status'], '')}]{r['status']}[/]", cell(r["value"]),
                  cell(r["threshold"]), cell(r["at_step"]))
    console.print(t)
    for suite in ("provenance", "forecast"):
        for res in run_suite(root, suite, RUN).results:
            cols = SHOWN.get(res.name, ())
            if cols is None or (not cols and res.name not in SHOWN):
                continue
            idx = [res.columns.index(c) for c in cols if c in res.columns]
            t = Table(*(res.columns[i] for i in idx), title=f"{suite}: {res.name}")
            for row in res.rows[:25]:
                t.add_row(*(cell(row[i])[:70] for i in idx))
            if not res.rows:
                t.caption = "no rows (nothing recorded for this question)"
            console.print(t)


def start_ui(demo: Demo) -> str:
    """`runledger ui` over the demo's root while it runs (`demo --ui`): its address, token included. The
    token goes to the child in a file only this user can read, never in its argv or environment (every
    local user can read those)."""
    import secrets
    import socket

    from runledger.ledger.bus.natsserver import write_private

    with socket.socket() as s:  # a free loopback port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_urlsafe(24)
    token_file = demo.root / "ui-token.json"
    write_private(token_file, json.dumps({"token": token}))
    demo.spawn("ui", "ui", "--root", str(demo.root), "--nats", demo.nats.url, "--port", str(port), "--token-file", str(token_file))
    return f"http://127.0.0.1:{port}/?token={token}"


def demo_key(root: Path) -> None:
    """The demo's own transparency-log key (a log per key: each demo root is a new log), outside the root,
    unless $RUNLEDGER_TLOG_KEY names one; the ledger it starts inherits it."""
    import os

    from runledger.ledger.tlog import log as tlog

    if not os.environ.get(tlog.KEY_ENV):
        path = settings.demo_dir() / "keys" / f"{root.name}.key"
        tlog.load_or_make_key(path, f"runledger.local/{root.name}")
        os.environ[tlog.KEY_ENV] = str(path)


def start_witness(demo: Demo) -> subprocess.Popen | None:
    """One local witness (`runledger witness serve`, its key beside the demo's log key) and a C2SP
    tlog-policy requiring its cosignature, in $RUNLEDGER_TLOG_POLICY for the ledger the demo starts next:
    the ledger sends it each new checkpoint. None when the log is off."""
    import os

    from runledger.ledger.tlog import cosignature, note, policy
    from runledger.ledger.tlog import log as tlog

    if not tlog.enabled():
        return None
    log_vkey = tlog.load_or_make_key(Path(os.environ[tlog.KEY_ENV])).verifier.text()
    key = settings.demo_dir() / "keys" / f"{demo.root.name}-witness.key"
    if not key.exists():
        note.write_key(key, cosignature.Cosigner.generate("witness.demo.local"))
    proc = subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "witness", "serve", "--port", "0", "--state",
                             str(demo.root / "witness"), "--key", str(key), "--log-key", log_vkey], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=open(demo.root / "logs" / "witness.log", "ab"), text=True)
    url = proc.stdout.readline().strip()  # its URL once it serves ('' if it died)
    if not url.startswith("http"):
        proc.wait()
        raise RuntimeError(f"the demo's witness did not start; see {demo.root / 'logs' / 'witness.log'}")
    pol = demo.root / "tlog-policy.txt"
    pol.write_text(f"log {log_vkey}\nwitness demo-witness {cosignature.read_key(key).verifier.text()} {url}\n"
                   "quorum demo-witness\n")
    os.environ[policy.POLICY_ENV] = str(pol)
    demo.console.print(f"witness: {url} (policy {pol}: its cosignature required)")
    return proc


def audit_log(root: Path, console: Console) -> bool:
    """The root's transparency log caught up and signed (what the ledger's own start does), cosigned by
    the policy's witnesses, its checkpoint printed, and `runledger tlog audit --policy` run on it from the
    public files alone."""
    import os

    from runledger.ledger.ingest.position import LedgerPosition
    from runledger.ledger.tlog import audit, policy
    from runledger.ledger.tlog import log as tlog
    from runledger.tools.args import attestations

    lg = tlog.for_ledger(root, LedgerPosition())
    if lg is None:
        console.print("tlog: off ($RUNLEDGER_TLOG)")
        return True
    if lg.witnessing is not None:  # (a checkpoint signed just now is asked for in the background)
        lg.witnessing.wait_idle(30)
    pol = policy.load(os.environ[policy.POLICY_ENV]) if os.environ.get(policy.POLICY_ENV) else None
    console.print(f"tlog checkpoint (verifier key {lg.signer.verifier.text()}):")
    console.print((lg.dir / "checkpoint").read_text().rstrip(), markup=False, highlight=False)
    try:
        done = audit.audit(str(lg.dir), [lg.signer.verifier], root, pol=pol,
                           attestations=attestations(None))  # (with the local attestation key, as the CLI's)
    except audit.AuditFailed as err:
        console.print(f"tlog audit FAILED: {err}", markup=False)
        return False
    for line in done.text().splitlines():
        console.print(f"tlog audit{' --policy' if pol else ''}: {line}", markup=False)
    return True


def run_demo(root: Path | None, quick: bool = False, ui: bool = False) -> int:
    if root is None:  # a fresh root each time, so a second demo never mixes with the first
        settings.demo_dir().mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix=time.strftime("demo-%Y%m%d-%H%M%S-"), dir=settings.demo_dir()))
    root = Path(root).resolve()
    console = Console()
    if not console.is_terminal:
        console = Console(width=150)
    plan = QUICK if quick else FULL
    demo = Demo(root, plan, console)
    demo_key(root)
    t0 = time.monotonic()
    console.rule(f"runledger demo ({'quick' if quick else 'full'}) → {root}")
    witness = None
    try:
        (root / "logs").mkdir(parents=True, exist_ok=True)
        witness = start_witness(demo)
        demo.start()
        if ui:
            console.print(f"watch it live: {start_ui(demo)}")
        with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console) as progress:
            if plan.ladder_scale is not None:
                demo.ladder(progress)
            demo.main_run(progress)
        happened = what_happened(root)
        print_audit(root, console)
    except BaseException:
        if witness is not None:
            witness.terminate()
        raise
    finally:
        demo.stop()
    report = verify(root)
    console.print(f"verify: {report.text().splitlines()[-1]} ({report.events} events)")
    from runledger.tools.report import write_report

    html = write_report(root, RUN, root / "report.html")
    try:
        logged = audit_log(root, console)
    finally:
        if witness is not None:
            witness.terminate()
            witness.wait(30)
    ok = report.ok and all(happened.values()) and logged
    console.print(json.dumps(happened))
    say_what_happened(happened, console)
    console.rule(f"{'done' if ok else 'INCOMPLETE'} in {time.monotonic() - t0:.0f}s · report: {html}")
    console.print(f"open this ledger in the dashboard: runledger ui --root {root}")
    return 0 if ok else 1
