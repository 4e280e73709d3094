"""TFRecord files (TensorBoard's event files) streamed a window at a time, every record's CRC-32C checked in numpy, in bounded memory.

The framing TensorBoard's record reader reads (`tensorboard.compat.tensorflow_stub.pywrap_tensorflow.
PyRecordReader_New`): per record an 8-byte little-endian length, the masked CRC-32C of those 8 bytes,
the data, the masked CRC-32C of the data. That reader computes each CRC a byte at a time in Python
(about 20 µs a scalar record, and about 100 ns a byte of an image). This one reads the file WINDOW
bytes at a time (a record longer than that alone, once its header's CRC says its length is real) and
checks, per window, the short records a column of bytes at a time across all records of one length,
and each long record (an image, a histogram) as LANES of bytes at once, their CRCs combined with the
CRC's shift matrices (the same algebra as zlib's crc32_combine). It yields exactly the records that
reader returns (tests/{unit,integration}/test_import.py, tests/attacks/test_attacks_import.py compare the two on real files). As
there: a record cut short at the end is not returned (a writer still writing), and a record whose CRC
fails raises. Memory: the window, plus the longest record, plus about twice the record being checked.
"""

from __future__ import annotations

import functools
import os
import struct
from pathlib import Path
from typing import Iterator

import numpy as np

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
_MASK_DELTA = 0xA282EAD8  # TFRecord's CRC mask (tensorflow/core/lib/hash/crc32c.h)
WINDOW = 4 << 20  # bytes read at a time
ROW_BYTES = 1 << 18  # bytes of short records checked per numpy pass (its index array is 8 bytes a byte)
LONG = 4096  # a record this long or longer is checked alone, in lanes
LANE = 64  # bytes per lane of a long record: the column loop is LANE numpy steps over len/LANE lanes
_HEADER = struct.Struct("<QI")


def _table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_POLY), table >> 1).astype(np.uint32)
    return table


_TABLE = _table()


class CorruptRecord(ValueError):
    """A record whose checksum fails: the one-line reason."""


def _mask(crc: np.ndarray) -> np.ndarray:
    crc = crc ^ np.uint32(0xFFFFFFFF)
    return (((crc >> 15) | (crc << 17)) + np.uint32(_MASK_DELTA)).astype(np.uint32)


def masked_crc32c(rows: np.ndarray) -> np.ndarray:
    """The masked CRC-32C of each row of a (n, L) uint8 array."""
    crc = np.full(rows.shape[0], 0xFFFFFFFF, dtype=np.uint32)
    for j in range(rows.shape[1]):
        crc = _TABLE[(crc ^ rows[:, j]) & 0xFF] ^ (crc >> 8)
    return _mask(crc)


def _apply(columns: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The GF(2) matrix whose 32 columns are `columns` applied to each of `values` (uint32)."""
    out = np.zeros(values.shape, dtype=np.uint32)
    for bit in range(32):
        out ^= np.where((values >> np.uint32(bit)) & np.uint32(1), columns[bit], np.uint32(0)).astype(np.uint32)
    return out


@functools.lru_cache(maxsize=64)
def _shift_columns(n: int) -> np.ndarray:
    """The columns of the matrix that moves a CRC register over n zero bytes (n = LANE * 2**k)."""
    if n == LANE:
        reg = np.uint32(1) << np.arange(32, dtype=np.uint32)
        for _ in range(LANE):
            reg = _TABLE[reg & 0xFF] ^ (reg >> 8)
        return reg
    half = _shift_columns(n // 2)
    return _apply(half, half)  # (the matrix squared)


@functools.lru_cache(maxsize=64)
def _shift_tables(n: int) -> np.ndarray:
    """(4, 256): the register moved over n zero bytes, by each byte of the register."""
    columns = _shift_columns(n)
    byte = np.arange(256, dtype=np.uint32)
    return np.stack([_apply(columns, byte << np.uint32(8 * k)) for k in range(4)])


def _shift(values: np.ndarray, n: int) -> np.ndarray:
    t = _shift_tables(n)
    return t[0][values & 0xFF] ^ t[1][(values >> 8) & 0xFF] ^ t[2][(values >> 16) & 0xFF] ^ t[3][values >> 24]


def masked_crc32c_long(data: bytes | memoryview) -> int:
    """The masked CRC-32C of one long byte string (at least 4 bytes), LANE bytes of each lane at a time.

    A CRC register run from zero is linear in the bytes, and leading zero bytes leave it zero: so the
    string, padded with zeros in front to whole lanes, is cut into lanes whose registers are computed
    side by side, then combined pairwise (the left one moved over the right one's length) until one is
    left. Starting from all ones (CRC-32C's initial value) is the same as flipping the first 4 bytes."""
    pad = -len(data) % LANE
    buf = np.zeros(pad + len(data), dtype=np.uint8)
    buf[pad:] = np.frombuffer(data, dtype=np.uint8)
    buf[pad:pad + 4] ^= 0xFF
    lanes = buf.reshape(-1, LANE)
    reg = np.zeros(lanes.shape[0], dtype=np.uint32)
    for j in range(LANE):
        reg = _TABLE[(reg ^ lanes[:, j]) & 0xFF] ^ (reg >> 8)
    n = LANE
    while len(reg) > 1:
        if len(reg) % 2:  # a lane of zeros in front: nothing changes
            reg = np.concatenate([np.zeros(1, dtype=np.uint32), reg])
        reg = _shift(reg[0::2], n) ^ reg[1::2]
        n *= 2
    return int(_mask(reg)[0])


def _u32_at(buf: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The little-endian uint32 at each offset of `buf`."""
    return np.ascontiguousarray(buf[offsets[:, None] + np.arange(4)]).view("<u4").ravel().astype(np.uint32)


def _check_short(buf: np.ndarray, starts: np.ndarray, length: int, sums: np.ndarray, at: np.ndarray, path: Path,
                 what: str) -> None:
    """Check the CRCs of records of one length (each `length` bytes at `starts` in `buf`) against `sums`."""
    step = max(1, ROW_BYTES // max(length, 1))
    for lo in range(0, len(starts), step):
        part = starts[lo:lo + step]
        rows = buf[part[:, None] + np.arange(length)] if length else np.empty((len(part), 0), np.uint8)
        bad = np.nonzero(masked_crc32c(rows) != sums[lo:lo + step])[0]
        if len(bad):
            raise CorruptRecord(f"{path}: the record at byte {int(at[lo + bad[0]])} fails its {what} crc32c check "
                                "(a corrupt event file)")


def _check_one(data: bytes | memoryview, expected: int, at: int, path: Path, what: str) -> None:
    if len(data) >= LONG:
        ok = masked_crc32c_long(data) == expected
    else:
        ok = int(masked_crc32c(np.frombuffer(data, dtype=np.uint8)[None, :])[0]) == expected
    if not ok:
        raise CorruptRecord(f"{path}: the record at byte {at} fails its {what} crc32c check (a corrupt event file)")


def _window_records(data: bytes, base: int, path: Path) -> tuple[list[bytes], int]:
    """The whole records at the start of `data` (which begins at byte `base` of the file), checked, and
    where the first record not whole in `data` starts (relative to `data`)."""
    size = len(data)
    pos = 0
    heads: list[int] = []
    lengths: list[int] = []
    unpack = struct.unpack_from
    while pos + 12 <= size:
        (n,) = unpack("<Q", data, pos)
        if pos + 16 + n > size:
            break
        heads.append(pos)
        lengths.append(n)
        pos += 16 + n
    if not heads:
        return [], pos
    buf = np.frombuffer(data, dtype=np.uint8)
    heads_a = np.asarray(heads, dtype=np.int64)
    lengths_a = np.asarray(lengths, dtype=np.int64)
    _check_short(buf, heads_a, 8, _u32_at(buf, heads_a + 8), heads_a + base, path, "header")
    data_sums = _u32_at(buf, heads_a + 12 + lengths_a)
    for n in np.unique(lengths_a):
        sel = np.nonzero(lengths_a == n)[0]
        if n >= LONG:
            view = memoryview(data)
            for i in sel:
                h = heads[i]
                _check_one(view[h + 12:h + 12 + int(n)], int(data_sums[i]), base + h, path, "data")
        else:
            _check_short(buf, heads_a[sel] + 12, int(n), data_sums[sel], heads_a[sel] + base, path, "data")
    return [data[h + 12:h + 12 + n] for h, n in zip(heads, lengths)], pos


def records(path: str | Path) -> Iterator[bytes]:
    """Every whole record of a TFRecord file, in order, CRCs checked (see the module docstring)."""
    path = Path(path)
    with open(path, "rb") as f:
        base, data = 0, f.read(WINDOW)
        while True:
            found, used = _window_records(data, base, path)
            yield from found
            base, data = base + used, data[used:]
            want = WINDOW
            if len(data) >= 12:  # a record longer than what is left of the window: its header first
                (n, header_sum) = _HEADER.unpack_from(data)
                _check_one(data[:8], header_sum, base, path, "header")
                if 16 + n - len(data) > os.fstat(f.fileno()).st_size - f.tell():  # not all written yet
                    return
                want = max(WINDOW, 16 + n - len(data))
            more = f.read(want)
            if not more:  # the end: what is left is a record cut short (a writer still writing), or nothing
                return
            data += more
