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
    # (a plain loop over the two length bytes: the audit reads every entry of a log, a million and more)
    out: list[bytes] = []
    append, at, end = out.append, 0, len(data)
    while at < end:
        if at + 2 > end:
            raise ValueError("an entry bundle cut inside a length")
        n = (data[at] << 8) | data[at + 1]
        at += 2
        if at + n > end:
            raise ValueError("an entry bundle cut inside an entry")
        append(data[at:at + n])
        at += n
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

    def read(self, rel: str, keep: bool = True) -> bytes:
        """The file `rel` (kept for the next read unless `keep` is false, or it is the checkpoint)."""
        if rel in self._cache:
            return self._cache[rel] if keep else self._cache.pop(rel)
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
        if keep and rel != CHECKPOINT:
            self._cache[rel] = data
        return data

    def checkpoint(self) -> str:
        return self.read(CHECKPOINT).decode("utf-8")

    def tile(self, level: int, n: int, size: int) -> list[bytes]:
        """The hashes of tile (level, n) as a tree of `size` has it (full, or partial at its width)."""
        data = self.tile_bytes(level, n, size)
        return [data[i:i + merkle.HASH_SIZE] for i in range(0, len(data), merkle.HASH_SIZE)]

    def tile_bytes(self, level: int, n: int, size: int, keep: bool = True) -> bytes:
        """Tile (level, n) of a tree of `size` as its file holds it, checked to be its width's length."""
        width = tile_width(level, n, size)
        if not width:
            raise TileMissing(f"tile {level}/{n} is beyond a tree of size {size}")
        data = self.read(tile_path(level, n, width), keep)
        if len(data) != width * merkle.HASH_SIZE:
            raise TileMissing(f"{tile_path(level, n, width)}: {len(data)} bytes, not {width * merkle.HASH_SIZE}")
        return data

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
        for bundle in self.bundles(size, n):
            skip = max(0, start - n * TILE_WIDTH)
            yield from bundle[skip:] if skip else bundle
            n += 1

    def bundles(self, size: int, first: int = 0) -> Iterator[list[bytes]]:
        """The entry bundles of a tree of `size` from bundle `first`, each as its list of entries (not kept:
        a log's entries are read once)."""
        n = first
        while n * TILE_WIDTH < size:
            width = min(TILE_WIDTH, size - n * TILE_WIDTH)
            bundle = unpack_entries(self.read(tile_path("entries", n, width), keep=False))
            if len(bundle) != width:
                raise TileMissing(f"{tile_path('entries', n, width)}: {len(bundle)} entries, not {width}")
            yield bundle
            n += 1


def tile_width(level: int, n: int, size: int) -> int:
    """How many hashes tile (level, n) holds in a tree of `size`: 256, its partial width, or 0 (beyond it)."""
    full, part = divmod(size >> (TILE_HEIGHT * level), TILE_WIDTH)
    return TILE_WIDTH if n < full else part if n == full else 0
