"""The values `log` records beside numbers: `Histogram`, `Table`, `Image` and `File` (and W&B's `Audio`, `Video`, `Html`
and `Object3D`, files too), each an event of its own.

    runledger.log({"loss": loss, "grads": runledger.Histogram(g), "samples": runledger.Table(columns=["prompt", "out"],
                   data=rows), "sample": runledger.Image(array, caption="step 10")})

`log` hands the values that are not numbers to `record` (one hook in `runledger.core.Run.log`), which makes each
an event of the contract (`runledger.ledger.contract.events`) at the step they were logged at, under their name:
- `histogram`: the buckets exactly (edges and counts) with count, min, max, sum and sum of squares (Levanter's
  SummaryStats). A list, a tuple or an array (numpy, JAX) given to `log` becomes one, as W&B does; so does a
  Levanter `Histogram` (its buckets, min, max, num, sum and sum_squares as they are).
- `table`: columns and rows of text, numbers, booleans and nulls; past MAX_TABLE_ROWS rows or MAX_TABLE_BYTES of
  text it is cut (the first rows kept), with one warning, and counted in the summary's `_tables_cut`.
- `media`: the bytes of an image (a numpy array, encoded as PNG here with zlib; a PIL image; a PNG, JPEG, GIF or
  WebP file) or of any file, stored once under the root by their SHA-256 (`{root}/media/{sha256}`, written
  whole, then renamed into place, before the event is sent), the event carrying digest, size and type.

What cannot be stored (a histogram with NaN edges, an array of text, an image of a shape no image has, a
file that cannot be read) is skipped with one warning naming it and counted in the summary's
`_skipped_values`: never an exception in the training loop. The constructors keep their arguments and do the
work when the value is logged, so a bad one is met there too.

The constructors take W&B's arguments (`Histogram(sequence, np_histogram=, num_bins=)`, `Table(columns=, data=,
rows=, dataframe=)`, `Image(data_or_path, caption=)`), so `import runledger as wandb` runs a W&B script. Only the
standard library is imported here: numpy (and PIL, for a PIL image) is loaded when a value needs it.
"""

from __future__ import annotations

import io
import json
import logging
import math
import mimetypes
import os
import struct
import zlib
from pathlib import Path
from typing import Any

from runledger.ledger.storage.media import blob_path, store_bytes, store_file

log = logging.getLogger("runledger")

# The bounds are the contract's (`runledger.ledger.contract.events`), repeated here so that `import runledger`
# loads no pydantic; tests/unit/test_values.py holds them equal.
MAX_BUCKETS = 10_000
MAX_TABLE_COLUMNS = 256
MAX_TABLE_ROWS = 10_000
MAX_TABLE_BYTES = 512 << 10
MAX_NAME = 256
_EXACT_INT = 2**53  # an integer past it is no JSON number every reader reads alike: kept as its text


class Value:
    """A value `log` records as an event of its own: `event(name, root)` gives (kind, payload)."""

    kind = ""

    def event(self, name: str, root: Path) -> tuple[str, dict]:
        raise NotImplementedError


class Skipped(ValueError):
    """A value that cannot be stored; the message says why (`record` warns once and counts it)."""


# -- histograms


class Histogram(Value):
    """A histogram: `Histogram(values, num_bins=64)` (a list, a numpy or JAX array: `num_bins` equal buckets
    over the finite values' range), `Histogram(np_histogram=(counts, edges))` (buckets given, as
    `numpy.histogram` returns them), or `Histogram(edges=, counts=, min=, max=, sum=, sum_squares=, count=)`
    (Levanter's SummaryStats, any buckets)."""

    kind = "histogram"

    def __init__(self, sequence: Any = None, np_histogram: Any = None, num_bins: int = 64, *, edges: Any = None,
                 counts: Any = None, min: Any = None, max: Any = None, sum: Any = None, sum_squares: Any = None,
                 count: Any = None) -> None:
        self.sequence, self.np_histogram, self.num_bins = sequence, np_histogram, num_bins
        self.given = {"edges": edges, "counts": counts, "min": min, "max": max, "sum": sum,
                      "sum_squares": sum_squares, "count": count}

    @classmethod
    def of_levanter(cls, h: Any) -> "Histogram":
        """Levanter's `levanter.tracker.histogram.Histogram` (min, max, num, sum, sum_squares, bucket_limits,
        bucket_counts: its buckets kept as they are)."""
        return cls(edges=h.bucket_limits, counts=h.bucket_counts, min=h.min, max=h.max, sum=h.sum,
                   sum_squares=h.sum_squares, count=h.num)

    def event(self, name: str, root: Path) -> tuple[str, dict]:
        return "histogram", {"key": name, **self.payload()}

    def payload(self) -> dict:
        """The histogram's fields as the contract's `histogram` payload holds them (without `key`)."""
        import numpy as np

        nonfinite = 0
        stats: dict[str, Any] = {}
        if self.given["counts"] is not None or self.given["edges"] is not None:
            edges, counts = self.given["edges"], self.given["counts"]
            stats = {k: _finite_or_none(self.given[k], k) for k in ("min", "max", "sum", "sum_squares")}
        elif self.np_histogram is not None:
            try:
                counts, edges = self.np_histogram
            except (TypeError, ValueError):
                raise Skipped("np_histogram is not a pair (counts, edges)") from None
        elif self.sequence is not None:
            values = _floats(self.sequence)
            finite = values[np.isfinite(values)]
            nonfinite = int(values.size - finite.size)
            bins = _int_or(self.num_bins, 64)
            if not 1 <= bins <= MAX_BUCKETS:
                raise Skipped(f"num_bins={self.num_bins!r}: 1 to {MAX_BUCKETS}")
            counts, edges = np.histogram(finite, bins=bins)
            if finite.size:
                stats = {"min": float(finite.min()), "max": float(finite.max()), "sum": float(finite.sum()),
                         "sum_squares": float(np.square(finite).sum())}
                stats = {k: _finite_or_none(v, k) for k, v in stats.items()}
        else:
            raise Skipped("a histogram of nothing (no values, np_histogram or counts)")
        edges, counts = _floats(edges, "edges").ravel(), _floats(counts, "counts").ravel()
        if not (np.isfinite(edges).all() and np.isfinite(counts).all()):
            raise Skipped("its edges or counts are not all finite (nan or inf)")
        if (counts < 0).any():
            raise Skipped("a count below zero")
        if edges.size != counts.size + 1 or counts.size < 1:
            raise Skipped(f"{edges.size} edges for {counts.size} counts: one more edge than counts, at least one count")
        if counts.size > MAX_BUCKETS:
            raise Skipped(f"{counts.size} buckets: at most {MAX_BUCKETS}")
        if (np.diff(edges) < 0).any():
            raise Skipped("its edges fall")
        count = self.given["count"]
        out = {"edges": _numbers(edges), "counts": _numbers(counts),
               "count": _numbers(counts.sum(keepdims=True))[0] if count is None else _finite_or_none(count, "count")}
        if out["count"] is None:
            raise Skipped("its count is not finite")
        out.update({k: v for k, v in stats.items() if v is not None})
        if nonfinite:
            out["nonfinite"] = nonfinite
        return out


def _floats(values: Any, what: str = "values") -> Any:
    import numpy as np

    try:
        return np.asarray(values, dtype=np.float64).ravel()
    except (TypeError, ValueError) as err:
        raise Skipped(f"its {what} are not numbers ({str(err)[:80]})") from None


def _numbers(a: Any) -> list:
    """A float64 array as JSON numbers: whole ones as ints (exact, and shorter), others as floats (whole floats would
    cost the canonical form a walk over them: `runledger.ledger.contract.canonical.fast_canonical`), at C speed."""
    import numpy as np

    whole = (a == np.trunc(a)) & (np.abs(a) <= _EXACT_INT)
    if whole.all():
        return a.astype(np.int64).tolist()
    if not whole.any():
        return a.tolist()
    out = a.astype(object)
    out[whole] = a[whole].astype(np.int64)
    return out.tolist()


def _finite_or_none(v: Any, what: str) -> float | None:
    if v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise Skipped(f"its {what} {v!r} is not a number") from None
    return x if math.isfinite(x) else None


def _int_or(v: Any, default: int) -> int:
    try:
        return int(v) if v is not None else default
    except (TypeError, ValueError):
        raise Skipped(f"{v!r} is not a whole number") from None


# -- tables


class Table(Value):
    """W&B's `Table(columns=None, data=None, rows=None, dataframe=None, ...)`: rows of text, numbers, booleans and
    nulls (anything else is kept as its text). add_data, add_column, get_column and iterrows work as W&B's."""

    kind = "table"

    def __init__(self, columns: list | None = None, data: Any = None, rows: Any = None, dataframe: Any = None,
                 dtype: Any = None, optional: Any = True, allow_mixed_types: bool = False, log_mode: str | None = None) -> None:
        if dataframe is not None:
            columns, data = list(dataframe.columns), dataframe.values.tolist()
        data = data if data is not None else rows
        self.data = [list(r) for r in (data.tolist() if hasattr(data, "tolist") else data or [])]
        self.columns = list(columns) if columns is not None else (
            [f"c{i}" for i in range(len(self.data[0]))] if self.data else ["Input", "Output", "Expected"])

    def add_data(self, *data: Any) -> None:
        self.data.append(list(data))

    def add_column(self, name: str, data: Any, optional: bool = False) -> None:
        self.columns.append(name)
        values = list(data)
        if not self.data:
            self.data = [[] for _ in values]
        for row, v in zip(self.data, values):
            row.append(v)

    def get_column(self, name: str, convert_to: str | None = None) -> list:
        i = self.columns.index(name)
        return [row[i] for row in self.data]

    def iterrows(self):
        yield from enumerate(self.data)

    def event(self, name: str, root: Path) -> tuple[str, dict]:
        return "table", {"key": name, **self.payload()}

    def payload(self) -> dict:
        """columns, rows (cut to the bounds) and rows_logged; `self.cut` says whether it was cut."""
        columns = [str(c) for c in self.columns]
        if len(columns) > MAX_TABLE_COLUMNS:
            raise Skipped(f"{len(columns)} columns: at most {MAX_TABLE_COLUMNS}")
        if any(len(c) > MAX_NAME for c in columns):
            raise Skipped(f"a column name longer than {MAX_NAME} characters")
        rows, size = [], len(json.dumps(columns))
        for row in self.data:
            if len(row) != len(columns):
                raise Skipped(f"a row of {len(row)} cells for {len(columns)} columns")
            if len(rows) == MAX_TABLE_ROWS:
                break
            cells = [_cell(v) for v in row]
            size += len(json.dumps(cells, ensure_ascii=False).encode()) + 1
            if size > MAX_TABLE_BYTES:
                break
            rows.append(cells)
        self.cut = len(rows) < len(self.data)
        return {"columns": columns, "rows": rows, "rows_logged": len(self.data)}


def _cell(v: Any) -> Any:
    """A table cell as JSON holds it exactly: text, a finite number, a boolean or null; an integer past 2**53,
    a number that is not finite ("nan", "inf") and anything else as its text."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if hasattr(v, "item") and getattr(v, "ndim", 0) == 0:
        v = v.item()  # numpy and JAX scalars
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v if -_EXACT_INT <= v <= _EXACT_INT else str(v)
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    return str(v)


# -- files and images


class File(Value):
    """Any file, or bytes: `File(path)`, `File(data=b"...", name="out.txt")`. Stored by its SHA-256 under the root
    (`{root}/media/`); `type` (a media type) defaults to the file's (by its first bytes, else its name)."""

    kind = "media"

    def __init__(self, path: str | os.PathLike | None = None, *, data: bytes | None = None, name: str | None = None,
                 type: str | None = None, caption: str | None = None) -> None:
        self.path, self.data, self.name, self.type, self.caption = path, data, name, type, caption

    def event(self, name: str, root: Path) -> tuple[str, dict]:
        if self.data is not None:
            digest, size = store_bytes(root, bytes(self.data))
            head = bytes(self.data[:16])
        elif self.path is not None:
            path = Path(self.path)
            try:
                digest, size = store_file(root, path)
                with open(path, "rb") as f:
                    head = f.read(16)
            except OSError as err:
                raise Skipped(f"file {str(self.path)[:200]!r} cannot be read ({err.strerror or err})") from None
        else:
            raise Skipped("no file and no bytes")
        file_name = self.name or (Path(self.path).name if self.path is not None else None)
        payload = {"key": name, "sha256": digest, "bytes": size, "type": self.type or media_type(head, file_name)}
        if file_name:
            payload["name"] = str(file_name)
        if self.caption is not None:
            payload["caption"] = str(self.caption)
        payload.update(image_size(head, root, digest))
        return "media", payload


class Image(File):
    """W&B's `Image(data_or_path, mode=None, caption=None, ...)`: a numpy (or JAX) array, height x width, with 1, 3
    or 4 channels last (or first: 3 x H x W), of bytes or of floats in [0, 1] (else scaled from their range to
    0..255), encoded as PNG; a PIL image (saved as PNG); or a PNG, JPEG, GIF or WebP file's path (its bytes as
    they are)."""

    def __init__(self, data_or_path: Any = None, mode: str | None = None, caption: str | None = None, **kwargs: Any) -> None:
        super().__init__(caption=caption)
        self.source, self.mode = data_or_path, mode

    def event(self, name: str, root: Path) -> tuple[str, dict]:
        src = self.source
        if isinstance(src, (str, os.PathLike)):
            self.path = src
        elif hasattr(src, "save") and hasattr(src, "mode") and hasattr(src, "size"):  # a PIL image
            out = io.BytesIO()
            img = src if src.mode in ("1", "L", "LA", "P", "RGB", "RGBA", "I;16") else src.convert("RGBA")
            try:
                img.save(out, format="PNG")
            except (OSError, ValueError) as err:
                raise Skipped(f"a PIL image in mode {src.mode} cannot be saved as PNG ({err})") from None
            self.data, self.type = out.getvalue(), "image/png"
        elif src is not None:
            self.data, self.type = png_of(src), "image/png"
        else:
            raise Skipped("an image of nothing")
        return super().event(name, root)


class Audio(File):
    """W&B's `Audio(data_or_path, sample_rate=None, caption=None)`: a sound file's bytes as they are, or an array of
    samples (floats in [-1, 1] or 16-bit integers; one channel, or samples x channels) written as 16-bit WAV (with
    the standard library's `wave`) at `sample_rate`."""

    def __init__(self, data_or_path: Any = None, sample_rate: int | None = None, caption: str | None = None) -> None:
        super().__init__(caption=caption)
        self.source, self.sample_rate = data_or_path, sample_rate

    def event(self, name: str, root: Path) -> tuple[str, dict]:
        if isinstance(self.source, (str, os.PathLike)):
            self.path = self.source
        elif self.source is not None:
            self.data, self.type = wav_of(self.source, self.sample_rate), "audio/wav"
        return super().event(name, root)


class Video(File):
    """W&B's `Video(data_or_path, caption=None, fps=None, format=None)`: a video file's bytes as they are. An array of
    frames is not encoded here (no video encoder in the standard library): it is skipped, with one warning."""

    def __init__(self, data_or_path: Any = None, caption: str | None = None, fps: Any = None, format: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(caption=caption)
        self.source = data_or_path

    def event(self, name: str, root: Path) -> tuple[str, dict]:
        if not isinstance(self.source, (str, os.PathLike, bytes)):
            raise Skipped("a video from an array of frames is not encoded: log its file (Video(path))")
        if isinstance(self.source, bytes):
            self.data = self.source
        else:
            self.path = self.source
        return super().event(name, root)


class Html(File):
    """W&B's `Html(data, inject=True)`: an HTML file's path, or HTML text, kept as text/html (the dashboard offers it
    as a download, never as a page of its own origin)."""

    def __init__(self, data: Any = None, inject: bool = True, **kwargs: Any) -> None:
        super().__init__()
        if isinstance(data, os.PathLike) or (isinstance(data, str) and data.lower().endswith((".html", ".htm"))
                                             and os.path.isfile(data)):
            self.path, self.type = data, "text/html"
        else:
            text = data.read() if hasattr(data, "read") else data
            self.data, self.type = (text.encode() if isinstance(text, str) else text), "text/html"


class Object3D(File):
    """W&B's `Object3D(data_or_path, caption=None)`: a 3D file's bytes as they are (glTF, GLB, OBJ, ...); an array of
    points is skipped, with one warning."""

    def __init__(self, data_or_path: Any = None, caption: str | None = None, **kwargs: Any) -> None:
        super().__init__(caption=caption)
        self.source = data_or_path

    def event(self, name: str, root: Path) -> tuple[str, dict]:
        if not isinstance(self.source, (str, os.PathLike)):
            raise Skipped("a 3D object from an array of points is not stored: log its file (Object3D(path))")
        self.path = self.source
        return super().event(name, root)


def wav_of(samples: Any, sample_rate: int | None) -> bytes:
    """16-bit PCM WAV of an array of samples (see `Audio`)."""
    import wave

    import numpy as np

    if not sample_rate or int(sample_rate) <= 0:
        raise Skipped("audio from an array needs its sample_rate")
    try:
        a = np.asarray(samples)
    except (TypeError, ValueError) as err:
        raise Skipped(f"not an array of samples ({err})") from None
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or a.size == 0 or a.dtype.kind not in "fiu":
        raise Skipped(f"an array of shape {tuple(a.shape)} and type {a.dtype} is no sound (samples, or samples x channels)")
    if a.dtype.kind == "f":
        if not np.isfinite(a).all():
            raise Skipped("samples that are not finite")
        a = np.rint(np.clip(a, -1.0, 1.0) * 32767)
    pcm = np.clip(a, -32768, 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(pcm.shape[1])
        w.setsampwidth(2)
        w.setframerate(int(sample_rate))
        w.writeframes(pcm.tobytes())
    return out.getvalue()


def png_of(array: Any) -> bytes:
    """A PNG of an image array (see `Image`), made with zlib: the same array gives the same bytes."""
    import numpy as np

    try:
        a = np.asarray(array)
    except (TypeError, ValueError) as err:
        raise Skipped(f"not an image array ({err})") from None
    if a.ndim == 3 and a.shape[0] in (1, 3, 4) and a.shape[2] not in (1, 3, 4):
        a = np.moveaxis(a, 0, -1)  # channels first, as PyTorch keeps them
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in (3, 4)) or 0 in a.shape:
        raise Skipped(f"an array of shape {tuple(a.shape)} is no image (height x width, with 1, 3 or 4 channels)")
    if a.dtype.kind == "b":
        a = a.astype(np.uint8) * 255
    elif a.dtype.kind in "fiu" and a.dtype != np.uint8:
        x = a.astype(np.float64)
        if not np.isfinite(x).all():
            raise Skipped("an image with values that are not finite")
        lo, hi = float(x.min()), float(x.max())
        if a.dtype.kind == "f" and lo >= 0 and hi <= 1:
            x = x * 255
        elif lo < 0 or hi > 255:
            x = (x - lo) * (255 / (hi - lo)) if hi > lo else np.zeros_like(x)
        a = np.rint(x).astype(np.uint8)
    elif a.dtype != np.uint8:
        raise Skipped(f"an array of {a.dtype} is no image")
    height, width = a.shape[:2]
    color = {2: 0, 3: {3: 2, 4: 6}.get(a.shape[-1])}[a.ndim]
    raw = b"".join(b"\x00" + row.tobytes() for row in np.ascontiguousarray(a))

    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF87a", "image/gif"),
          (b"GIF89a", "image/gif"), (b"glTF", "model/gltf-binary"))


def media_type(head: bytes, name: str | None) -> str:
    """A file's media type: by its first bytes (PNG, JPEG, GIF, WebP), else its name's, else application/octet-stream."""
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    if head[:4] == b"RIFF" and head[8:12] in (b"WEBP", b"WAVE"):
        return "image/webp" if head[8:12] == b"WEBP" else "audio/wav"
    guessed = mimetypes.guess_type(name or "")[0] if name else None
    return guessed.lower() if guessed and "/" in guessed and len(guessed) < 128 else "application/octet-stream"


def image_size(head: bytes, root: Path, digest: str) -> dict:
    """{"width", "height"} of a PNG (from its header), else {}."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        with blob_path(root, digest).open("rb") as f:
            header = f.read(24)
        if len(header) == 24 and header[12:16] == b"IHDR":
            width, height = struct.unpack(">II", header[16:24])
            return {"width": width, "height": height}
    return {}


# -- what `log` calls


def value_of(v: Any) -> Value | None:
    """The Value a logged value is: itself; a list, tuple or array (numpy, JAX: more than one number) as a
    Histogram; Levanter's Histogram as one; None for anything else (a W&B chart, an object)."""
    if isinstance(v, Value):
        return v
    if hasattr(v, "bucket_counts") and hasattr(v, "bucket_limits"):
        return Histogram.of_levanter(v)
    if isinstance(v, (list, tuple)) or (hasattr(v, "__array__") and getattr(v, "ndim", 0)):
        return Histogram(v)
    return None


def record(run: Any, values: dict, step: int) -> None:
    """Emit each value (name -> value, as `log` met them) as its event at `step` through the run's sink (the
    blobs first). One that cannot be stored is skipped with one warning and counted in the summary's
    `_skipped_values`; a table cut to the bounds is kept, with one warning, counted in `_tables_cut`. The
    caller holds off SIGINT and SIGTERM meanwhile (`runledger.core.Run.log`)."""
    from runledger.ledger.contract.events import InvalidEvent
    from runledger.wandb_compat import skipped, skipped_value

    for name, v in values.items():
        value = value_of(v)
        if value is None:  # (a chart from plot.*, warned about there; an object of no kind stored)
            _count(run, "_skipped_values")
            skipped_value(name, v)
            continue
        if getattr(run, "_disabled", False):
            continue
        try:
            kind, payload = value.event(name, run.root)  # (a Path: Run keeps it so)
            run._sink.emit_dict(kind, payload, step)
        except (Skipped, InvalidEvent, OSError) as err:
            _count(run, "_skipped_values")
            what = type(v).__name__ if isinstance(v, Value) else f"{type(v).__name__} (as a Histogram)"
            skipped(f"a {what} that cannot be stored", f"{name!r} at step {step}: {err}; counted in the summary's "
                                                        "_skipped_values")
            continue
        if getattr(value, "cut", False):
            _count(run, "_tables_cut")
            skipped("a Table past the bound", f"{name!r} at step {step} has {payload['rows_logged']} rows: the first "
                                              f"{len(payload['rows'])} are kept ({MAX_TABLE_ROWS} rows or "
                                              f"{MAX_TABLE_BYTES >> 10} KiB at most); counted in the summary's _tables_cut")


def _count(run: Any, key: str) -> None:
    summary = getattr(run, "summary", None)
    if summary is not None:
        summary[key] = int(summary.get(key, 0)) + 1
