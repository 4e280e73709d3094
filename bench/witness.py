"""How many cosigning round trips one witness sustains, in one command (issue 48):

    python -m bench.witness --rounds 300 --per-round 50

`runledger witness serve` as a child process on loopback; a log (runledger.ledger.tlog.log.Log, its tiles
in a temp folder) appends `--per-round` leaves and signs, then the ledger's client
(runledger.ledger.tlog.witnessing.Witnessing.cosign, run in this thread) sends the checkpoint with a
consistency proof from the size the witness has and attaches the cosignature to tlog/checkpoint. A
round trip: proof from the tiles, the POST (kept alive), the witness's checks, fsync and cosignature,
the client's check, the checkpoint rewritten. Printed: round trips per minute, against the most a
ledger's log asks for (one checkpoint per SIGN_EVERY_S per log)."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--per-round", type=int, default=50, help="leaves appended between two checkpoints")
    args = p.parse_args()

    from runledger.ledger.tlog import cosignature, note, policy
    from runledger.ledger.tlog import log as tlog
    from runledger.ledger.tlog.witnessing import Witnessing

    tmp = Path(tempfile.mkdtemp(prefix="bench-witness-"))
    signer = note.Signer.generate("bench.example/log")
    wkey = cosignature.Cosigner.generate("bench.example/witness")
    note.write_key(tmp / "witness.key", wkey)
    proc = subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "witness", "serve", "--port", "0",
                             "--state", str(tmp / "state"), "--key", str(tmp / "witness.key"),
                             "--log-key", signer.verifier.text()], stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        pol = policy.parse(f"witness W {wkey.verifier.text()} {url}\nquorum W\n")
        lg = tlog.Log(tmp / "root", None, signer)
        lg.open([])
        w = Witnessing(lg.dir, pol, lg.attach_cosignatures)
        times, n = [], 0
        for r in range(args.rounds):
            lg.append_entries([f'{{"leaf":{n + i}}}'.encode() for i in range(args.per_round)])
            n += args.per_round
            signed = lg.sign()
            started = time.perf_counter()
            assert w.cosign(signed), w.failing
            times.append(time.perf_counter() - started)
        signed = (lg.dir / "checkpoint").read_text()
        assert cosignature.cosigners(signed, [wkey.verifier]), "the last checkpoint is not cosigned"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    per_min = 60 / statistics.mean(times)
    asked = 60 / tlog.SIGN_EVERY_S
    print(f"{args.rounds} round trips, {args.per_round} leaves apart (log size {n}): median "
          f"{statistics.median(times) * 1e3:.1f} ms, p90 {sorted(times)[int(len(times) * 0.9)] * 1e3:.1f} ms")
    print(f"one witness sustains {per_min:,.0f} round trips/min; a log asks for at most {asked:.0f}/min "
          f"(one checkpoint per {tlog.SIGN_EVERY_S:g} s): {per_min / asked:,.0f}x, i.e. ~{per_min / asked:,.0f} "
          f"logs (partitions) per witness at full rate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
