"""Replay speed: events per second folded into a RunState, for a 1M-event run, in one command.

    python -m bench.replay [--events N] [--no-parquet]    (about 6 minutes here; --no-parquet: 1)

  fold            runledger.ledger.check.replay.replay() over envelopes already in memory (dicts with parsed payloads,
                  as run_events returns them); target >= 200,000 events/s
  fold, dispatch  the same events through a bare loop that only dispatches on kind, the floor any
                  fold in Python pays (the baseline of the ratio)
  parquet read    runledger.ledger.check.replay.run_events() of the same run written by runledger.ledger.storage.store.write_events
                  (then compacted, as the ledger does): read, sort, rows, payload JSON parsed
  replay_run      read + fold, what `runledger replay RUN` costs

The run: run_started, then per step a `step` and a `drops` event (8 MoE layers with counts), an eval
and a checkpoint every 1,000 steps, an alert opened and resolved every 5,000 and a decision with its
application every 20,000: the shape of a training run's ledger.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

from runledger.ledger.check import replay as rp
from runledger.ledger.storage import compaction, paths, store
from runledger.ledger.storage.rows import StoredEvent

log = logging.getLogger("bench.replay")

RUN_ID = "replay"
LAYERS = 8
TOKENS = 8192
LAYER_ASSIGNMENTS = TOKENS * 2  # top-k 2
WRITE_EVENTS = 20_000  # events per write_events call; the small files are then compacted, as the ledger does


def make_events(n: int) -> list[dict]:
    """`n` envelopes in stream order, shaped as run_events returns them (payload parsed)."""
    out: list[dict] = []

    def add(kind: str, step: int | None, payload: dict) -> None:
        seq = len(out)
        out.append({"event_id": f"{RUN_ID}:worker-0:0:{seq}", "run_id": RUN_ID, "producer": "worker-0", "attempt": 0,
                    "seq": seq, "kind": kind, "time": f"2026-11-29T10:{seq // 60_000 % 60:02d}:{seq // 1000 % 60:02d}."
                    f"{seq % 1000:03d}000Z", "step": step, "payload": payload, "stream_seq": seq + 1})

    add("run_started", 0, {"config": {"preset": "bench"}, "config_hash": "c0ffee", "token_budget": TOKENS * n,
                           "schedule": {"peak_lr": 3e-4, "warmup_steps": 100, "horizon_steps": n // 2}})
    step = 0
    while len(out) < n:
        step += 1
        add("step", step, {"loss": 2.5 + 8.0 / (1 + step / 200) ** 0.5, "grad_norm": 1.0 + (step % 13) * 0.01,
                           "lr": 3e-4, "tokens": TOKENS, "step_time_s": 0.5, "mfu": 0.31})
        f = 0.02 + (step % 17) * 0.003
        layers = [{"layer": i, "assignments": LAYER_ASSIGNMENTS, "sender_dropped": int(f * LAYER_ASSIGNMENTS * 0.4),
                   "receiver_dropped": int(f * LAYER_ASSIGNMENTS * 0.6),
                   "drop_fraction": (int(f * LAYER_ASSIGNMENTS * 0.4) + int(f * LAYER_ASSIGNMENTS * 0.6)) / LAYER_ASSIGNMENTS}
                  for i in range(LAYERS)]
        dropped = sum(x["sender_dropped"] + x["receiver_dropped"] for x in layers)
        add("drops", step, {"dispatch": "capacity", "assignments": LAYER_ASSIGNMENTS * LAYERS, "dropped": dropped,
                            "drop_fraction": dropped / (LAYER_ASSIGNMENTS * LAYERS), "layers": layers,
                            "cf_send": 1.25, "cf_recv": 1.25})
        if step % 1_000 == 0:
            add("eval", step, {"loss": 2.6, "domain_losses": {"web": 2.7, "code": 2.2}})
            add("checkpoint", step, {"path": f"ckpt/{step}", "bytes": 1 << 30, "seconds": 3.0,
                                     "content_hash": f"{step:064x}", "tokens_seen": step * TOKENS})
        if step % 5_000 == 0:
            alert = {"alert_id": f"a{step}", "agent": "agent-drops", "rule": "drop_fraction", "message": "drops > 7%"}
            add("alert", step, alert)
            add("alert", step, {**alert, "state": "resolved"})
        if step % 20_000 == 0:
            add("decision", step, {"decision_id": f"d{step}", "agent": "agent-drops", "rule": "drop_fraction",
                                   "action": "set_capacity_factor", "params": {"cf_recv": 1.5}, "rationale": "drops"})
            add("decision_applied", step, {"decision_id": f"d{step}", "action": "set_capacity_factor",
                                           "after": {"cf_recv": 1.5}})
    return out[:n]


def fold_dispatch_only(events: list[dict]) -> int:
    """The floor: a Python loop that looks at each event's kind and payload, and nothing more."""
    handlers = {k: None for k in rp.FOLD}
    n = 0
    for e in events:
        if handlers.get(e["kind"], 0) is None:
            n += e["payload"] is not None
    return n


def timed(fn, *args):
    gc.collect()
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def write_ledger(root: Path, events: list[dict]) -> None:
    """The run as the ledger stores it: store.write_events in batches, then compaction.compact."""
    dumps = json.dumps
    for i in range(0, len(events), WRITE_EVENTS):
        rows = []
        for e in events[i:i + WRITE_EVENTS]:
            env = {**e, "schema_version": 1, "prev_hash": "", "hash": "0" * 64}
            rows.append(StoredEvent(env, dumps(e["payload"], sort_keys=True, separators=(",", ":")), e["stream_seq"]))
        store.write_events(root, rows)
    compaction.compact(root)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--no-parquet", action="store_true", help="only the in-memory fold")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    n = args.events
    log.info("building %d events", n)
    events = make_events(n)
    kinds: dict[str, int] = {}
    for e in events:
        kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
    _, t_floor = timed(fold_dispatch_only, events)
    state, t_fold = timed(rp.replay, RUN_ID, events)
    _, t_fold2 = timed(rp.replay, RUN_ID, events)
    t_fold = min(t_fold, t_fold2)
    assert state.events == n and state.step == events[-1]["step"], "the fold did not see every event"
    rows = [("fold (in memory)", t_fold, n / t_fold, t_floor / t_fold),
            ("fold, dispatch only (floor)", t_floor, n / t_floor, 1.0)]
    if not args.no_parquet:
        tmp = Path(tempfile.mkdtemp(prefix="rl-bench-replay-"))
        try:
            log.info("writing them with runledger.ledger.storage.store.write_events")
            _, t_write = timed(write_ledger, tmp, events)
            read, t_read = timed(rp.run_events, tmp, RUN_ID)
            assert len(read) == n
            del read
            from_disk, t_run = timed(rp.replay_run, tmp, RUN_ID)
            assert from_disk.to_json() == state.to_json(), "replay from Parquet differs from replay in memory"
            rows += [("parquet read (run_events)", t_read, n / t_read, t_floor / t_read),
                     ("replay_run (read + fold)", t_run, n / t_run, t_floor / t_run)]
            log.info("store.write_events + compact: %.0f events/s, %d files", n / t_write, len(paths.event_files(tmp)))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(f"{n} events: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])))
    print(f"{'path':<30} {'seconds':>9} {'events/s':>11} {'floor/path':>11}")
    for name, t, rate, ratio in rows:
        print(f"{name:<30} {t:>9.3f} {rate:>11.0f} {ratio:>11.3f}")
    print(f"target: fold >= 200,000 events/s: {'met' if n / t_fold >= 200_000 else 'MISSED'} ({n / t_fold:,.0f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
