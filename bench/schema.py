"""What one run's metric names cost every other run of the root: run B's one-metric event stored, and a
query of B's metric, before and after run A logs `--names` new names a step for `--steps` steps, in one
command:

    python -m bench.schema [--names 2048] [--steps 8] [--repeat 5] [--keep DIR]

Each event is sealed and stored by the ledger's own writer (`runledger.ledger.emit.sink.ParquetSink`: the file, its
commit to the Iceberg tables), one commit per step as the ledger makes it; the query is
`select step, value from metric('loss') where run_id = 'b'` through `queries.query` (the views of one
snapshot, as `runledger sql` runs it), measured once B's commits have made the table's kept snapshots
steady (2 x KEEP_SNAPSHOTS). Medians of `--repeat` are printed with their ratio after/before, and the
metric columns and schemas of the metrics table (every past schema is in its metadata). The control,
in a second root: run A logs the same names every step (a wide run of the usual kind), so that what
the machine's load does to the ratio is seen beside what new names do.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path

from runledger import queries
from runledger.ledger.emit.sink import ParquetSink
from runledger.ledger.storage.tables import KEEP_SNAPSHOTS, Tables


def timed(action, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(root: Path, seqs, steps: itertools.count, repeat: int) -> tuple[float, float]:
    """(store run B's one-metric event, query run B's metric), medians of `repeat`."""
    def store_b() -> None:
        with ParquetSink(root, "b", stream_seqs=seqs) as sink:
            sink.emit_dicts("metrics", [{"metrics": {"loss": 1.0}}], [next(steps)])

    def query_b() -> None:
        queries.query(root, "select step, value from metric('loss') where run_id = 'b'")

    return timed(store_b, repeat), timed(query_b, repeat)


def schema_size(root: Path) -> tuple[int, int]:
    table = Tables(root, mark=False).table("metrics")
    return sum(1 for f in table.schema().fields if "/" in f.name), len(table.schemas())


def scenario(args, new_names: bool) -> dict:
    """B's store and query before and after run A's steps, A logging new names each step (or, as the
    control, the same names each step: a wide run of the usual kind), in a fresh root."""
    root = (args.keep or Path(tempfile.mkdtemp(prefix="bench-schema-"))) / ("flood" if new_names else "control")
    seqs = itertools.count(1)
    steps_b = itertools.count()
    for _ in range(2 * KEEP_SNAPSHOTS):  # B's commits until the snapshots kept are steady (tables.KEEP_SNAPSHOTS)
        measure(root, seqs, steps_b, 1)
    out = dict(zip(("store_before", "query_before"), measure(root, seqs, steps_b, args.repeat)))
    out["columns_before"], out["schemas_before"] = schema_size(root)
    start = time.perf_counter()
    for step in range(args.steps):
        prefix = f"s{step}/" if new_names else ""
        with ParquetSink(root, "a", stream_seqs=seqs) as sink:
            sink.emit_dicts("metrics", [{"metrics": {f"{prefix}name_{i}": float(i) for i in range(args.names)}}], [step])
    out["a_s"] = (time.perf_counter() - start) / args.steps
    out.update(zip(("store_after", "query_after"), measure(root, seqs, steps_b, args.repeat)))
    out["columns_after"], out["schemas_after"] = schema_size(root)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, default=2048, help="names run A logs a step")
    parser.add_argument("--steps", type=int, default=8, help="steps of run A (one commit each)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="build the roots here and keep them")
    args = parser.parse_args()
    for new_names in (True, False):
        r = scenario(args, new_names)
        print(f"run A logs {args.names} {'new names' if new_names else 'names, the same'} a step for {args.steps} steps "
              f"({r['a_s']:.2f} s a step); metrics table: {r['columns_before']} -> {r['columns_after']} metric columns, "
              f"{r['schemas_before']} -> {r['schemas_after']} schemas")
        for what, label in (("store", "store B's one-metric event"), ("query", "query B's metric")):
            before, after = r[f"{what}_before"], r[f"{what}_after"]
            print(f"  {label:27s} {before * 1e3:7.1f} ms -> {after * 1e3:7.1f} ms, ratio {after / before:.2f}")


if __name__ == "__main__":
    main()
