"""What attesting a checkpoint costs (runledger.ledger.attest): the `tiny` run's worker with attestation on
and off (wall time of the whole train() call, and the loop's time in `save`), and one attestation of a
synthetic checkpoint folder of --mb MB (hashing + signing + statement), in seconds and MB/s.

    python -m bench.attest --steps 40 --mb 256
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path


def _train(attest: bool, steps: int, where: Path) -> tuple[float, list[float]]:
    from runledger.ledger.emit.sink import ListSink
    from runledger.training.config import PRESETS
    from runledger.training.worker import train

    cfg = dataclasses.replace(PRESETS["tiny"], steps=steps, ckpt_every=5, eval_every=1000, log_every=1000)
    rec = ListSink("worker-0")
    t = time.perf_counter()
    train(cfg, run_id="bench", ckpt_dir=where, sink=rec, peak_flops=1e11, attest=attest)
    wall = time.perf_counter() - t
    return wall, [p["seconds"] for _, p in rec.payloads("attestation")]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--mb", type=int, default=256)
    args = p.parse_args()
    from runledger.ledger import attest

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("RUNLEDGER_ATTEST_KEY", str(Path(tmp) / "attest.key"))
        _train(False, 6, Path(tmp) / "warm")  # (compiles once)
        rows = []
        for i, on in enumerate([False, True, False, True]):
            wall, each = _train(on, args.steps, Path(tmp) / f"run{i}")
            rows.append((on, wall, each))
        off = statistics.median(w for on, w, _ in rows if not on)
        on_ = statistics.median(w for on, w, _ in rows if on)
        each = [s for on, _, e in rows if on for s in e]
        print(f"tiny, {args.steps} steps, a checkpoint every 5: train() {off:.2f}s without, {on_:.2f}s with "
              f"attestation ({on_ / off:.2f}x); {len(each) // 2} attestations a run, median {statistics.median(each) * 1e3:.0f} ms "
              "each, in the background thread")
        folder = Path(tmp) / "big" / "step_00000001"
        (folder / "state").mkdir(parents=True)
        for k in range(8):
            (folder / "state" / f"{k}.data").write_bytes(os.urandom(args.mb * 1024 * 1024 // 8))
        key = attest.load_or_make_key()
        t = time.perf_counter()
        attest.attest(folder, key=key, root=None, config={}, config_hash="0" * 64, data_sources=[], code_commit=None,
                      run={"run_id": "bench", "producer": "worker-0", "attempt": 0, "step": 1, "tokens_seen": 0},
                      started=time.time())
        dt = time.perf_counter() - t
        print(f"a {args.mb} MB folder (8 files): attested in {dt:.2f}s ({args.mb / dt:.0f} MB/s)")


if __name__ == "__main__":
    main()
