"""The demo's main run, resumed: does the resumed attempt redo its steps as its past did, and does a loss
spike fire after the resume? Issue 43: a demo's main run showed a loss of 4.67 at step 50, after the resume,
against 2.3-3.0 on either side.

    python -m bench.demo_resume --seeds 0 1 2 --until 80 --root /tmp/h43c/demo-resume

Each seed trains the demo's main run as `runledger demo` plans it (tools/demo.py FULL: the `small` preset,
a horizon of 160 steps, a checkpoint every 20, a context extension to 1024 scheduled at step 12, the
demo's thresholds) with the real worker into a ledger root (its Parquet sink, no NATS), with the drop
agent's rule on the probes beside it (agents/drops.py: hold the extension while the last 3 probes drop
more than the demo's limit, 33%; release it when none of them does). Attempt 0 stops after step 30 (the
demo kills it once its horizon decision is applied past a checkpoint, or at 60; `--kill-at`); attempt 1
resumes from the checkpoint at step 20 (`--resume-from`), as the demo's resume does, once
as before (the resumed worker was not told of the hold in force: `--as-before`) and once as now
(`Start.extension_holds`, replayed from the attempt before). Each run is then audited: loss_spike and
resume_matches, and the step its training length went to 1024 in each attempt.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import tempfile
from pathlib import Path

from runledger import queries
from runledger.ledger.emit.sink import ParquetSink
from runledger.queries import audit
from runledger.tools.demo import FULL
from runledger.training import checkpoint
from runledger.training.config import preset
from runledger.training.schedule import make_schedule, retime
from runledger.training.worker import Start, train

log = logging.getLogger("bench.demo_resume")
PEAK = 1e11  # a fixed peak keeps a run from measuring the machine (as the tests)


class Probes:
    """The sink the worker emits to, with the drop agent's hold rule read off the probes it passes on."""

    def __init__(self, sink, limit: float, moves: list, attempt: int):
        self.sink, self.limit, self.moves, self.attempt = sink, limit, moves, attempt  # moves: (step, held) applied
        self.producer = sink.producer
        self.fractions: list[float] = []
        self.asked = 0

    def emit(self, event, step=None):
        if getattr(event, "probe", None):
            self.fractions.append(event.drop_fraction)
        if type(event).__name__ == "DecisionApplied" and event.status == "applied":
            self.moves.append((step, event.action == "hold_context_extension"))
        return self.sink.emit(event, step=step)

    def emit_many(self, events, steps=None):
        return [self.emit(e, s) for e, s in zip(events, steps or [None] * len(events))]

    def close(self):
        return self.sink.close()

    def decisions(self, step: int) -> list[dict]:
        """agents/drops.py on the last 3 probes: hold while all are over the limit, release when none is."""
        last = self.fractions[-3:]
        held = bool(self.moves) and self.moves[-1][1]
        if len(last) == 3 and all(f > self.limit for f in last) and not held:
            action = "hold_context_extension"
        elif held and last and not any(f > self.limit for f in last):
            action = "release_context_extension"
        else:
            return []
        self.asked += 1
        return [{"decision_id": f"a{self.attempt}-d{self.asked}", "action": action, "params": {}}]


def attempt(root: Path, run_id: str, n: int, cfg, ckpts: Path, start: Start, steps: int, moves: list) -> None:
    with ParquetSink(root, run_id, "worker-0", n) as sink:
        probes = Probes(sink, FULL.thresholds["drop_fraction_agent_max"], moves, n)
        train(cfg, run_id=run_id, ckpt_dir=ckpts, sink=probes, start=start, steps=steps, preset=FULL.preset,
              peak_flops=PEAK, decisions=probes.decisions, thresholds=FULL.thresholds,
              extend=(FULL.extend_at, FULL.extend_len), attest=False)


def demo_run(root: Path, seed: int, until: int, as_before: bool, kill_at: int, resume_from: int) -> str:
    run_id = f"demo-s{seed}-{'before' if as_before else 'now'}"
    cfg = dataclasses.replace(preset(FULL.preset), seed=seed, ckpt_every=FULL.ckpt_every)
    o = cfg.optim
    schedule = retime(make_schedule(o.peak_lr, o.warmup_steps, cfg.steps, o.min_lr_ratio,
                                    tokens_per_step=cfg.tokens_per_step), 1, FULL.horizon)
    moves: list[tuple[int, bool]] = []
    with tempfile.TemporaryDirectory() as tmp:
        ckpts = Path(tmp)
        attempt(root, run_id, 0, cfg, ckpts, Start(schedule=schedule), kill_at, moves)
        meta = checkpoint.latest(ckpts, at_or_before=resume_from)
        held = () if as_before else tuple(m for m in moves if m[0] is not None)
        start = Start(attempt=1, checkpoint_path=meta["path"], step=meta["step"], schedule=meta["schedule"],
                      content_hash=meta["content_hash"], extension_holds=held)
        attempt(root, run_id, 1, cfg, ckpts, start, until, list(moves))
    return run_id


def extended_at(root: Path, run_id: str) -> dict[int, int | None]:
    """Per attempt, the first step trained at the longer length (None: never)."""
    rows = queries.connect(root).execute(
        "select attempt, min(step) filter (where seq_len = ?) from drops where run_id = ? group by attempt order by attempt",
        [FULL.extend_len, run_id]).fetchall()
    return dict(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--until", type=int, default=FULL.horizon, help="the resumed attempt's last step")
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--kill-at", type=int, default=30, help="attempt 0's last step (the demo kills it once the "
                    "horizon decision is applied past a checkpoint: on a loaded machine soon after step 20)")
    ap.add_argument("--resume-from", type=int, default=20, help="the checkpoint attempt 1 resumes from")
    ap.add_argument("--as-before", action="store_true", help="only the resume as before (the hold not replayed)")
    ap.add_argument("--now", action="store_true", help="only the resume as now")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    variants = [v for v, skip in ((True, args.now), (False, args.as_before)) if not skip]
    for seed in args.seeds:
        for as_before in variants:
            run_id = demo_run(args.root, seed, args.until, as_before, args.kill_at, args.resume_from)
            rows = {r["check"]: r for r in audit.run_suite(args.root, "health", run_id).rows()}
            spike, resume = rows["loss_spike"], rows["resume_matches"]
            print(json.dumps({"run": run_id, "extended_at_step": extended_at(args.root, run_id),
                              "loss_spike": [spike["status"], spike["at_step"], spike["value"]],
                              "resume_matches": [resume["status"], resume["at_step"], resume["value"]],
                              "fired": sorted(c for c, r in rows.items() if r["status"] in ("warn", "fail"))}),
                  flush=True)


if __name__ == "__main__":
    main()
