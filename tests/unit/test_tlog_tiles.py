"""The log as tlog-tiles: the spec's worked example of a tree of 70,000 leaves, proofs read back from
the tiles alone, and the writer's promises (a crash before the size moved, an edited entry refused
against the last signed checkpoint, no checkpoint signed that forks the last)."""

from __future__ import annotations

import json

import pytest

from runledger.ledger.tlog import checkpoint, merkle, note, tiles
from runledger.ledger.tlog.log import Log, TlogRefused


def _entries(n: int, start: int = 0) -> list[bytes]:
    return [json.dumps({"i": i}).encode() for i in range(start, start + n)]


def test_index_paths_as_the_spec_writes_them():
    assert tiles.index_path(1234067) == "x001/x234/067"
    assert tiles.tile_path(0, 273, 112) == "tile/0/273.p/112"
    assert tiles.tile_path("entries", 5) == "tile/entries/005"


def test_the_tlog_tiles_worked_example_of_70000_leaves(tmp_path):
    lg = Log(tmp_path, signer=note.Signer.generate("runledger.test/log"))
    lg.open([])
    lg.append_entries(_entries(70_000))
    lg.sign()
    d = tmp_path / "tlog"
    for rel in ("tile/0/273.p/112", "tile/1/001.p/17", "tile/2/000.p/1", "tile/entries/273.p/112",
                "tile/0/272", "tile/1/000", "tile/entries/272"):
        assert (d / rel).is_file(), rel
    assert set(tiles.tiles_for(70_000)) == {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()} - {"checkpoint"}
    assert (d / "tile/0/000").stat().st_size == 8192
    # a reader of the files alone gets the tree head, proofs, and the entries
    signed = (d / "checkpoint").read_text()
    cp = checkpoint.open_signed(signed, [lg.signer.verifier])
    hashes = [merkle.leaf_hash(e) for e in _entries(70_000)]
    assert (cp.size, cp.root) == (70_000, merkle.root_of(hashes))
    reader = tiles.Tiles(d)
    node = reader.node(cp.size)
    for i in (0, 255, 256, 65_535, 65_536, 69_999):
        merkle.verify_inclusion(i, cp.size, hashes[i], merkle.inclusion_proof(node, i, cp.size), cp.root)
    for old in (1, 256, 4_097, 65_536, 69_999):
        merkle.verify_consistency(old, cp.size, merkle.root_of(hashes[:old]), cp.root,
                                  merkle.consistency_proof(node, old, cp.size))
    assert list(reader.entries(cp.size, start=69_990)) == _entries(10, 69_990)


def test_appending_in_many_commits_gives_the_same_tiles(tmp_path):
    one = Log(tmp_path / "a", signer=None)
    one.open([])
    one.append_entries(_entries(600))
    many = Log(tmp_path / "b", signer=None)
    many.open([])
    for i in range(0, 600, 7):
        many.append_entries(_entries(min(7, 600 - i), i))
    assert one.tree_root() == many.tree_root() == merkle.root_of([merkle.leaf_hash(e) for e in _entries(600)])
    for rel in tiles.tiles_for(600):
        assert (tmp_path / "a/tlog" / rel).read_bytes() == (tmp_path / "b/tlog" / rel).read_bytes()
    assert not (tmp_path / "b/tlog/tile/0/002.p/7").exists()  # partial tiles: only for sizes a checkpoint has


def test_a_crash_before_the_size_moved_and_stored_events_without_leaves(tmp_path):
    s = note.Signer.generate("runledger.test/log")
    lg = Log(tmp_path, signer=s)
    lg.open([])
    events = [(("r", "p", 0, i), f"h{i}") for i in range(300)]
    lg.append_entries([json.dumps({"attempt": 0, "hash": h, "producer": "p", "run_id": "r", "seq": k[3]},
                                  separators=(",", ":"), sort_keys=True).encode() for k, h in events[:100]])
    lg.sign()
    (tmp_path / "tlog/tile/0/000.p/100").write_bytes(b"torn")  # a tile half-written when the ledger died
    again = Log(tmp_path, signer=s)
    assert again.open(events) == 200  # every stored event gets its leaf, once
    assert again.size == 300
    third = Log(tmp_path, signer=s)
    assert third.open(events) == 0 and third.size == 300
    assert checkpoint.open_signed((tmp_path / "tlog/checkpoint").read_text(), [s.verifier]).size == 300


def test_an_edited_entry_is_refused_against_the_last_signed_checkpoint(tmp_path):
    s = note.Signer.generate("runledger.test/log")
    lg = Log(tmp_path, signer=s)
    lg.open([])
    lg.append_entries(_entries(10))
    lg.sign()
    bundle = tmp_path / "tlog/tile/entries/000.p/10"
    bundle.write_bytes(bundle.read_bytes().replace(b'{"i": 3}', b'{"i": 4}'))
    with pytest.raises(TlogRefused, match="last signed checkpoint"):
        Log(tmp_path, signer=s).open([])


def test_no_checkpoint_is_signed_that_forks_the_last(tmp_path):
    s = note.Signer.generate("runledger.test/log")
    lg = Log(tmp_path, signer=s)
    lg.open([])
    lg.append_entries(_entries(10))
    lg.sign()
    other = Log(tmp_path, signer=s)  # a second writer that took the log over, and went on
    other.open([])
    other.append_entries(_entries(5, 10))
    other.sign()
    lg.append_entries(_entries(2, 100))  # the first, still holding size 10, tries to go its own way
    with pytest.raises(TlogRefused):
        lg.sign()
