"""TFRecord files (TensorBoard's event files) read a file at a time, every record's CRC-32C checked in numpy.

The framing TensorBoard's record reader reads (`tensorboard.compat.tensorflow_stub.pywrap_tensorflow.
PyRecordReader_New`): per record an 8-byte little-endian length, the masked CRC-32C of those 8 bytes,
the data, the masked CRC-32C of the data. That reader computes each CRC a byte at a time in Python
(about 20 µs a scalar record here), which made it most of an import's time; this one finds the
records with one pass over the lengths and checks every CRC a column of bytes at a time across all
records of one length, with the same table, and returns exactly the records that reader returns
(tests/test_import.py compares the two on real files). As there: a record cut short at the end is
not returned (a writer still writing), and a record whose CRC fails raises.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
_MASK_DELTA = 0xA282EAD8  # TFRecord's CRC mask (tensorflow/core/lib/hash/crc32c.h)
CHUNK = 65_536  # records checked per numpy pass (bounds the index arrays' memory)


def _table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_POLY), table >> 1).astype(np.uint32)
    return table


_TABLE = _table()


class CorruptRecord(ValueError):
    """A record whose checksum fails: the one-line reason."""


def masked_crc32c(rows: np.ndarray) -> np.ndarray:
    """The masked CRC-32C of each row of a (n, L) uint8 array."""
    crc = np.full(rows.shape[0], 0xFFFFFFFF, dtype=np.uint32)
    for j in range(rows.shape[1]):
        crc = _TABLE[(crc ^ rows[:, j]) & 0xFF] ^ (crc >> 8)
    crc ^= np.uint32(0xFFFFFFFF)
    return (((crc >> 15) | (crc << 17)) + np.uint32(_MASK_DELTA)).astype(np.uint32)


def _check(buf: np.ndarray, starts: np.ndarray, length: int, sums: np.ndarray, path: Path, what: str) -> None:
    for lo in range(0, len(starts), CHUNK):
        part = starts[lo:lo + CHUNK]
        rows = buf[part[:, None] + np.arange(length)] if length else np.empty((len(part), 0), np.uint8)
        bad = np.nonzero(masked_crc32c(rows) != sums[lo:lo + CHUNK])[0]
        if len(bad):
            raise CorruptRecord(f"{path}: the record at byte {int(part[bad[0]])} fails its {what} crc32c check "
                                "(a corrupt event file)")


def _u32_at(buf: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The little-endian uint32 at each offset of `buf`."""
    return np.ascontiguousarray(buf[offsets[:, None] + np.arange(4)]).view("<u4").ravel().astype(np.uint32)


def records(path: str | Path) -> list[bytes]:
    """Every whole record of a TFRecord file, in order, CRCs checked (see the module docstring)."""
    path = Path(path)
    data = path.read_bytes()
    size = len(data)
    heads, lengths = [], []
    pos = 0
    unpack = struct.unpack_from
    while pos + 12 <= size:
        (n,) = unpack("<Q", data, pos)
        if pos + 16 + n > size:  # the writer has not finished this record
            break
        heads.append(pos)
        lengths.append(n)
        pos += 16 + n
    if not heads:
        return []
    buf = np.frombuffer(data, dtype=np.uint8)
    heads_a = np.asarray(heads, dtype=np.int64)
    lengths_a = np.asarray(lengths, dtype=np.int64)
    header_sums = _u32_at(buf, heads_a + 8)
    data_sums = _u32_at(buf, heads_a + 12 + lengths_a)
    _check(buf, heads_a, 8, header_sums, path, "header")
    for n in np.unique(lengths_a):
        sel = np.nonzero(lengths_a == n)[0]
        _check(buf, heads_a[sel] + 12, int(n), data_sums[sel], path, "data")
    return [data[h + 12:h + 12 + n] for h, n in zip(heads, lengths)]
