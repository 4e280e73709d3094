"""Stored event files read a batch at a time, side by side in about stream order: what the chain walk
of `verify` and the fold of `replay` stream from, in memory bounded by a batch per open file.

The files come from `runledger.ledger.storage.paths.event_files` (through the caller): the one place a reader learns
which files to read. A file is opened when the stream reaches its first stream seq (from its Parquet
statistics), so the files of a partition written one after another are open one at a time.
"""

from __future__ import annotations

import heapq
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from runledger.ledger.storage.objects import source

BATCH_ROWS = 4_096  # rows of a batch: small, so that its memory is reused by the next (see runledger.ledger.check.rowcheck)


def first_stream_seq(path: Path) -> int:
    """The smallest stream seq in a file by its statistics (0 if it has none, or cannot be read)."""
    try:
        meta = pq.ParquetFile(source(path)).metadata
        i = [meta.schema.column(j).path for j in range(meta.num_columns)].index("stream_seq")
        mins = [meta.row_group(g).column(i).statistics for g in range(meta.num_row_groups)]
        return min((s.min for s in mins if s is not None and s.has_min_max), default=0)
    except (OSError, ValueError):  # (a file without the column: ValueError from index)
        return 0


def in_stream_order(paths: list[Path], columns: list[str], batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Batches of `columns` (stream_seq among them) of all `paths`, the next always from the file that
    has been read least far in stream order. Within a file, file order. A file that cannot be read is
    left where it fails (`runledger.ledger.check.rowcheck` names it)."""
    heap = [(first_stream_seq(p), i, None) for i, p in enumerate(paths)]
    heapq.heapify(heap)
    while heap:
        _, i, batches = heapq.heappop(heap)
        try:
            if batches is None:
                batches = pq.ParquetFile(source(paths[i])).iter_batches(batch_size=batch_rows, columns=columns, use_threads=False)
            batch = next(batches, None)
        except (OSError, ValueError):
            continue
        if batch is None:
            continue
        if batch.num_rows:
            yield batch
        last = pc.max(batch.column("stream_seq")).as_py() if batch.num_rows else None
        heapq.heappush(heap, (last or 0, i, batches))
