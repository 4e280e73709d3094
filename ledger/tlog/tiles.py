"""A log as C2SP tlog-tiles (c2sp.org/tlog-tiles): the paths of hash tiles and entry bundles, and a
log read from its files alone, from a folder, over HTTP or from object storage (`Tiles`): its checkpoint, its node hashes
(for runledger.ledger.tlog.merkle's proofs), its entries. Writing them is runledger.ledger.tlog.log's."""

from __future__ import annotations

import struct
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

from runledger.ledger.tlog import merkle

TILE_HEIGHT = 8  # tlog-tiles: a tile is a subtree of height 8
TILE_WIDTH = 1 << TILE_HEIGHT  # 256 hashes, 8,192 bytes when full
MAX_ENTRY = 0xFFFF  # an entry bundle prefixes each entry with a big-endian uint16 length
CHECKPOINT = "checkpoint"
MAX_READ = 1 << 20  # no tile, bundle or checkpoint of ours is larger (a full bundle of 256 entries of < 4 KiB)


class TileMissing(LookupError):
    """A tile, bundle or checkpoint that a size needs and the log does not have; one line."""


def index_path(n: int) -> str:
    """`n` as tlog-tiles' zero-padded 3-digit path elements, all but the last prefixed `x`."""
    parts = [f"{n % 1000:03d}"]
    n //= 1000
    while n:
        parts.append(f"x{n % 1000:03d}")
        n //= 1000
    return "/".join(reversed(parts))


def tile_path(level: int | str, n: int, width: int = TILE_WIDTH) -> str:
    """tile/<L>/<N>[.p/<W>] (level "entries" for an entry bundle)."""
    if not 0 < width <= TILE_WIDTH:
        raise ValueError(f"a tile's width is 1..256, not {width}")
    return f"tile/{level}/{index_path(n)}" + ("" if width == TILE_WIDTH else f".p/{width}")


def tiles_for(size: int) -> list[str]:
    """Every tile and bundle path a tree of `size` is served as (full, then partial; level by level)."""
    out = []
    level, count = 0, size
    while count:
        full, part = divmod(count, TILE_WIDTH)
        out += [tile_path(level, n) for n in range(full)]
        if part:
            out.append(tile_path(level, full, part))
        level, count = level + 1, full
    full, part = divmod(size, TILE_WIDTH)
    out += [tile_path("entries", n) for n in range(full)] + ([tile_path("entries", full, part)] if part else [])
    return out


def pack_entries(entries: list[bytes]) -> bytes:
    for e in entries:
        if len(e) > MAX_ENTRY:
            raise ValueError(f"an entry of {len(e)} bytes (a bundle holds at most {MAX_ENTRY})")
    return b"".join(struct.pack(">H", len(e)) + e for e in entries)


def unpack_entries(data: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(data):
        if at + 2 > len(data):
            raise ValueError("an entry bundle cut inside a length")
        (n,) = struct.unpack_from(">H", data, at)
        if at + 2 + n > len(data):
            raise ValueError("an entry bundle cut inside an entry")
        out.append(data[at + 2:at + 2 + n])
        at += 2 + n
    return out


class Tiles:
    """A log's public files, from a folder (`tlog/` or `tlog/p{N}/`) or a URL prefix, read for one tree
    size: only the tiles that size needs (tlog-tiles: never an arbitrary partial tile)."""

    def __init__(self, where) -> None:
        self.where = str(where)
        self.http = self.where.startswith(("http://", "https://"))
        self.object = self.where.startswith("s3://")  # beside the tables on object storage
        self._cache: dict[str, bytes] = {}

    @property
    def remote(self) -> bool:
        """Read over HTTP or from object storage: files are read by name only, never listed."""
        return self.http or self.object

    def read(self, rel: str) -> bytes:
        if rel in self._cache:
            return self._cache[rel]
        if self.http:
            url = self.where.rstrip("/") + "/" + rel
            try:
                with urllib.request.urlopen(url, timeout=30) as r:  # noqa: S310 (a URL the user gave)
                    data = r.read(MAX_READ + 1)
            except urllib.error.HTTPError as err:
                if err.code == 404:
                    raise TileMissing(f"{url}: not found") from None
                raise
        elif self.object:
            from runledger.ledger.storage.objects import ObjectPath

            path = ObjectPath(self.where) / rel
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                raise TileMissing(f"{path}: missing") from None
        else:
            path = Path(self.where) / rel
            try:
                with open(path, "rb") as f:
                    data = f.read(MAX_READ + 1)
            except FileNotFoundError:
                raise TileMissing(f"{path}: missing") from None
        if len(data) > MAX_READ:
            raise TileMissing(f"{rel}: larger than any tile ({MAX_READ} bytes)")
        if rel != CHECKPOINT:
            self._cache[rel] = data
        return data

    def checkpoint(self) -> str:
        return self.read(CHECKPOINT).decode("utf-8")

    def tile(self, level: int, n: int, size: int) -> list[bytes]:
        """The hashes of tile (level, n) as a tree of `size` has it (full, or partial at its width)."""
        count = size >> (TILE_HEIGHT * level)
        full, part = divmod(count, TILE_WIDTH)
        width = TILE_WIDTH if n < full else part if n == full else 0
        if not width:
            raise TileMissing(f"tile {level}/{n} is beyond a tree of size {size}")
        data = self.read(tile_path(level, n, width))
        if len(data) != width * merkle.HASH_SIZE:
            raise TileMissing(f"{tile_path(level, n, width)}: {len(data)} bytes, not {width * merkle.HASH_SIZE}")
        return [data[i:i + merkle.HASH_SIZE] for i in range(0, len(data), merkle.HASH_SIZE)]

    def node(self, size: int) -> merkle.Node:
        """`node(level, index)` for runledger.ledger.tlog.merkle, read from the tiles of a tree of `size`."""
        def node(level: int, index: int) -> bytes:
            t, r = divmod(level, TILE_HEIGHT)
            first = index << r  # the first hash at level t*8 under this node
            hashes = self.tile(t, first // TILE_WIDTH, size)
            at = first % TILE_WIDTH
            return merkle.root_of(hashes[at:at + (1 << r)])
        return node

    def entries(self, size: int, start: int = 0) -> Iterator[bytes]:
        """The entries of leaves start..size-1, bundle by bundle."""
        n = start // TILE_WIDTH
        while n * TILE_WIDTH < size:
            width = min(TILE_WIDTH, size - n * TILE_WIDTH)
            bundle = unpack_entries(self.read(tile_path("entries", n, width)))
            if len(bundle) != width:
                raise TileMissing(f"{tile_path('entries', n, width)}: {len(bundle)} entries, not {width}")
            for i, e in enumerate(bundle):
                if n * TILE_WIDTH + i >= start:
                    yield e
            self._cache.pop(tile_path("entries", n, width), None)
            n += 1
